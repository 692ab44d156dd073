"""TraceRecorder: one JSON line per event of an engine's life, written as it happens (`--trace FILE`).

Events (times in seconds from the start of the trace, monotonic clock):
- `config`: first line; what a replay needs to rebuild the scheduler and KV manager.
- `arrival`: request id, prompt tokens and their hash, sampling parameters (`SamplingParams.to_dict`), priority,
  metadata, `queued` (false while its grammar compiles; a `queued` event follows), `step` (the next step's index).
- `queued`, `abort`: a request entering the scheduler late, or aborted, before step `step`.
- `step`: its index and start, the time spent scheduling, in the forward, sampling (with the token updates) and
  producing outputs; every chunk as [request id, start position, tokens]; the draft tokens verified (speculative
  decoding) per request; preemptions and why each happened;
  forks as [parent, child, context length]; the new tokens as [request id, token] (in order; a sequence may get
  several in one step); the sequences that ended
  as [request id, status]; cache hits (tokens) of first admissions, blocks evicted, KV usage and the queue
  lengths after the step.
- `finish`: a user request's end: reason, output tokens, TTFT and e2e, metadata.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from radixlm.config import EngineConfig
from radixlm.core.scheduler import Scheduler
from radixlm.core.step import SchedulerOutput
from radixlm.lora_request import LoRARequest
from radixlm.outputs import RequestOutput
from radixlm.request import Request

if TYPE_CHECKING:  # the trace tools import TRACE_VERSION from here and load no tokenizer library
    from radixlm.engine.parent_request import ParentRequest

TRACE_VERSION = 1  # the format this recorder writes and `radixlm/trace/` reads


def prompt_hash(token_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:16]


class TraceRecorder:
    """Owned by one engine; `close()` flushes the file. Nothing here runs when tracing is off."""

    def __init__(self, path: str | Path, config: EngineConfig, num_blocks: int, max_model_len: int,
                 eos_token_ids: frozenset[int], num_host_blocks: int = 0) -> None:
        self._file: IO[str] = Path(path).open("w", encoding="utf-8", buffering=1)  # noqa: SIM115  (one line an event, open for the engine's life)
        self._start = time.monotonic()
        self._evicted_seen = 0
        scheduler = {k: v for k, v in asdict(config.scheduler).items() if k != "trace"}
        self._write({"event": "config", "version": TRACE_VERSION, "model": config.model.model,
                     "scheduler": scheduler, "num_blocks": num_blocks, "block_size": config.cache.block_size,
                     "enable_prefix_caching": config.cache.enable_prefix_caching, "max_model_len": max_model_len,
                     "num_host_blocks": num_host_blocks,
                     "eos_token_ids": sorted(eos_token_ids)})

    def _write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")

    def time(self, monotonic: float | None = None) -> float:
        return round((time.monotonic() if monotonic is None else monotonic) - self._start, 6)

    def arrival(self, parent: ParentRequest, queued: bool, step: int) -> None:
        first = parent.first.request
        self._write({"event": "arrival", "time": self.time(first.times.arrival), "step": step,
                     "request_id": parent.request_id, "prompt_len": len(parent.prompt_token_ids),
                     "prompt_hash": prompt_hash(parent.prompt_token_ids), "prompt_token_ids": parent.prompt_token_ids,
                     "params": parent.params.to_dict(), "priority": first.priority, "queued": queued,
                     "metadata": parent.metadata, **_lora_fields(first.lora_request)})

    def queued(self, request_id: str, step: int) -> None:
        self._write({"event": "queued", "time": self.time(), "step": step, "request_id": request_id})

    def abort(self, request_id: str, step: int) -> None:
        self._write({"event": "abort", "time": self.time(), "step": step, "request_id": request_id})

    def step(self, index: int, marks: tuple[float, float, float, float, float], output: SchedulerOutput,
             requests: list[Request], sampled: list[tuple[str, list[int]]], scheduler: Scheduler,
             forward_failed: bool) -> None:
        """`marks`: perf_counter at the start, after scheduling, after the forward, after the token updates, at the
        end; `requests`: those scheduled and those forked; `sampled`: (request id, new tokens) of each sequence
        that received tokens."""
        everyone = requests
        manager = scheduler.kv_cache_manager
        evicted = manager.num_evicted_blocks - self._evicted_seen
        self._evicted_seen = manager.num_evicted_blocks
        by_id = {r.request_id: r for r in requests}
        start, scheduled, forwarded, sampled_at, end = marks
        self._write({
            "event": "step", "step": index, "time": round(self.time() - (end - start), 6),
            "schedule_s": round(scheduled - start, 6), "forward_s": round(forwarded - scheduled, 6),
            "sample_s": round(sampled_at - forwarded, 6), "outputs_s": round(end - sampled_at, 6),
            "chunks": [[c.request_id, c.start_position, c.num_tokens] for c in output.chunks],
            "drafts": {c.request_id: c.token_ids[c.num_tokens - c.num_draft_tokens:] for c in output.chunks
                       if c.num_draft_tokens},
            "preempted": output.preempted_request_ids, "preemption_reasons": output.preemption_reasons,
            "forks": [[f.parent_id, f.child_id, by_id[f.parent_id].num_prompt_tokens] for f in output.forks],
            "forward_failed": forward_failed,
            "sampled": [[request_id, token] for request_id, token_ids in sampled for token in token_ids],
            "ended": [[r.request_id, r.status.name] for r in everyone if r.is_finished],
            "cache_hits": {c.request_id: c.start_position for c in output.chunks if c.start_position > 0 and
                           c.start_position == by_id[c.request_id].num_cached_tokens and
                           by_id[c.request_id].num_output_tokens == int(c.samples)},
            "evicted_blocks": evicted, "kv_used_blocks": manager.block_pool.num_used_blocks,
            **_tier_moves(output),
            "num_running": scheduler.num_running, "num_waiting": scheduler.num_waiting})

    def finish(self, parent: ParentRequest, output: RequestOutput) -> None:
        first = parent.first.request
        self._write({"event": "finish", "time": self.time(), "request_id": parent.request_id,
                     "reasons": [c.finish_reason for c in output.outputs], "error": output.error,
                     "output_tokens": sum(s.request.num_output_tokens for s in parent.children),
                     "ttft": output.metrics.ttft, "e2e": output.metrics.e2e,
                     "first_token": self.time(first.times.first_token) if first.times.first_token else None,
                     "metadata": parent.metadata})

    def close(self) -> None:
        self._file.close()


def _lora_fields(lora_request: LoRARequest | None) -> dict[str, object]:
    """The adapter of a request's arrival (none for the base model): its name and id, which key its prefixes."""
    return {} if lora_request is None else {"lora_name": lora_request.lora_name, "lora_id": lora_request.lora_int_id}


def _tier_moves(output: SchedulerOutput) -> dict[str, int]:
    """A step's KV tier copies, in blocks: device to host and back, host (or, at shutdown, device) to disk and
    back."""
    transfers = output.kv_transfers
    if not transfers:
        return {}
    return {"offloaded_blocks": len(transfers.offloads), "loaded_blocks": len(transfers.loads),
            "disk_written_blocks": len(transfers.disk_writes) + len(transfers.device_saves),
            "disk_read_blocks": len(transfers.disk_reads)}
