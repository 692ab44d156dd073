"""What-if runs: a trace's requests under other scheduler flags, timed by a cost model fitted to the trace.

The stand-in runner gives each sequence its recorded tokens in order and ends it where it ended (its recorded
status after its recorded number of tokens; an aborted one at its recorded abort time). A step costs
`a + b * tokens + c * chunks + d * attended context + e * blocks moved to or from the host tier`, least squares
over the trace's own steps. Requests arrive at their recorded times. The same simulation under the recorded flags
shows how well the model fits.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixlm.core.step import ModelRunnerOutput, SchedulerOutput
from radixlm.request import RequestStatus
from radixlm.trace.replay import ReplayState, Trace

FEATURES = ("1", "tokens", "chunks", "context", "moved_blocks")


def step_features(chunks: list[tuple[str, int, int]], moved_blocks: int = 0) -> list[float]:
    return [1.0, float(sum(n for _, _, n in chunks)), float(len(chunks)),
            float(sum(start + n for _, start, n in chunks)), float(moved_blocks)]


def moved_blocks(step: dict[str, Any]) -> int:
    """A recorded step's tier copies: blocks to and from host memory and disk."""
    return sum(int(step.get(name, 0)) for name in ("offloaded_blocks", "loaded_blocks", "disk_written_blocks",
                                                    "disk_read_blocks"))


@dataclass(frozen=True)
class CostModel:
    coefficients: tuple[float, ...]
    min_step_s: float

    @classmethod
    def fit(cls, trace: Trace) -> CostModel:
        steps = [s for s in trace.of("step") if not s.get("forward_failed")]
        if len(steps) < len(FEATURES):
            raise ValueError(f"the trace has {len(steps)} steps; a cost model needs at least {len(FEATURES)}")
        x = np.array([step_features(s["chunks"], moved_blocks(s)) for s in steps])
        y = np.array([s["schedule_s"] + s["forward_s"] + s["sample_s"] + s["outputs_s"] for s in steps])
        coefficients, *_ = np.linalg.lstsq(x, y, rcond=None)
        return cls(tuple(float(c) for c in coefficients), float(y.min()))

    def predict(self, chunks: list[tuple[str, int, int]], moved: int = 0) -> float:
        cost = sum(c * f for c, f in zip(self.coefficients, step_features(chunks, moved), strict=True))
        return max(cost, self.min_step_s)


@dataclass
class RunMetrics:
    ttfts: list[float]
    itls: list[float]
    num_output_tokens: int
    seconds: float

    def summary(self) -> dict[str, float]:
        return {"ttft_mean": statistics.fmean(self.ttfts) if self.ttfts else float("nan"),
                "ttft_p50": statistics.median(self.ttfts) if self.ttfts else float("nan"),
                "itl_p50": statistics.median(self.itls) if self.itls else float("nan"),
                "output_tok_per_s": self.num_output_tokens / self.seconds if self.seconds else float("nan")}


def recorded_metrics(trace: Trace) -> RunMetrics:
    """The recorded run, measured as the simulation measures (a token's time is the end of its step)."""
    arrivals = {e["request_id"]: e["time"] for e in trace.of("arrival")}
    token_times: dict[str, list[float]] = {}
    end = 0.0
    for step in trace.of("step"):
        end = step["time"] + step["schedule_s"] + step["forward_s"] + step["sample_s"] + step["outputs_s"]
        for seq_id, _ in step["sampled"]:
            token_times.setdefault(seq_id, []).append(end)
    return _metrics(arrivals, token_times, end - min(arrivals.values(), default=0.0))


def _metrics(arrivals: dict[str, float], token_times: dict[str, list[float]], seconds: float) -> RunMetrics:
    ttfts = [token_times[rid][0] - arrivals[rid] for rid in arrivals if token_times.get(rid)]
    itls = [b - a for rid in arrivals for a, b in itertools.pairwise(token_times.get(rid, []))]
    return RunMetrics(ttfts, itls, sum(map(len, token_times.values())), seconds)


def simulate(trace: Trace, model: CostModel, **overrides: Any) -> RunMetrics:
    """Run the trace's requests through a scheduler built with `overrides` (scheduler flags, num_kv_blocks)."""
    state = ReplayState.build(trace.config, **overrides)
    scheduler = state.scheduler
    recorded = _recorded_sequences(trace)
    arrivals = sorted(trace.of("arrival"), key=lambda e: e["time"])
    aborts = {e["request_id"]: e["time"] for e in trace.of("abort")}
    arrival_times = {e["request_id"]: e["time"] for e in arrivals}
    token_times: dict[str, list[float]] = {}
    clock, next_arrival = (arrivals[0]["time"] if arrivals else 0.0), 0
    while next_arrival < len(arrivals) or scheduler.has_unfinished_requests():
        while next_arrival < len(arrivals) and arrivals[next_arrival]["time"] <= clock:
            event = arrivals[next_arrival]
            state.arrive(event, arrival_time=event["time"], held=False)
            next_arrival += 1
        for request_id, abort_time in list(aborts.items()):
            if abort_time <= clock:
                state.abort(request_id)
                del aborts[request_id]
        output = scheduler.schedule()
        if output.is_empty:
            if next_arrival < len(arrivals):
                clock = max(clock, arrivals[next_arrival]["time"])
                continue
            break
        transfers = output.kv_transfers
        moved = (len(transfers.offloads) + len(transfers.loads) + len(transfers.disk_writes) +
                 len(transfers.device_saves) + len(transfers.disk_reads)) if transfers else 0
        clock += model.predict([(c.request_id, c.start_position, c.num_tokens) for c in output.chunks], moved)
        _stand_in_tokens(state, output, recorded, token_times, clock)
    return _metrics(arrival_times, token_times, clock - (arrivals[0]["time"] if arrivals else 0.0))


def _recorded_sequences(trace: Trace) -> dict[str, tuple[list[int], RequestStatus]]:
    """Each sequence's recorded tokens, and how it ended."""
    tokens: dict[str, list[int]] = {}
    ends: dict[str, RequestStatus] = {}
    for step in trace.of("step"):
        for seq_id, token in step["sampled"]:
            tokens.setdefault(seq_id, []).append(token)
        for seq_id, status in step["ended"]:
            ends[seq_id] = RequestStatus[status]
    return {seq_id: (tokens.get(seq_id, []), ends.get(seq_id, RequestStatus.FINISHED_LENGTH))
            for seq_id in set(tokens) | set(ends)}


def _stand_in_tokens(state: ReplayState, output: SchedulerOutput,
                     recorded: dict[str, tuple[list[int], RequestStatus]], token_times: dict[str, list[float]],
                     now: float) -> None:
    """A stand-in for the forward: one recorded token per sampling sequence (forked ones included) through the
    core's update path; each sequence ends where its recording ended."""
    sampling = output.sampling_request_ids
    tokens = [[_next_token(recorded, state.requests[request_id])] for request_id in sampling]
    state.scheduler.update_from_output(output, ModelRunnerOutput(list(sampling), tokens, [None] * len(tokens)))
    for request_id in sampling:
        token_times.setdefault(request_id, []).append(now)
        recorded_tokens, status = recorded.get(request_id, ([], RequestStatus.FINISHED_LENGTH))
        if state.requests[request_id].num_output_tokens >= len(recorded_tokens):
            state.end(request_id, status)


def _next_token(recorded: dict[str, tuple[list[int], RequestStatus]], request: Any) -> int:
    tokens = recorded.get(request.request_id, ([], None))[0]
    return tokens[request.num_output_tokens] if request.num_output_tokens < len(tokens) else 0
