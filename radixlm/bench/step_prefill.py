"""`radixlm bench step --prefill-lens N`: where the time of one prompt's prefill goes, in one step.

Each measured step computes one fresh prompt of N random tokens in a single chunk (the token budget is raised to N,
prefix caching is off) and samples its first token, so the step is the request's time to first token inside the
engine. The same probe as the decode rows (`radixlm.bench.step_probe`) splits it into attention, linears, the rest
of the forward, the runner's preparation, sampler, scheduler and engine. A prefill is compute-bound, so no memory
bound is printed beside it: the rate it reaches (prompt tokens per second) is the figure to compare.
"""

from __future__ import annotations

import statistics

import torch

from radixlm.bench.step_probe import StepProbe, step_parts
from radixlm.engine.llm_engine import build_engine
from radixlm.sampling_params import SamplingParams

WARMUP_PREFILLS = 1


def bench_prefill(engine_options: dict, prefill_lens: tuple[int, ...], num_steps: int,
                  seed: int = 0) -> list[tuple[int, dict[str, float]]]:
    """Per prompt length, the median milliseconds of each part over `num_steps` one-chunk prefills."""
    rows = []
    for length in prefill_lens:
        if length < 1:
            raise ValueError(f"prefill lengths must be >= 1, got {length}")
        options = {**engine_options, "enable_prefix_caching": False, "max_num_seqs": 1,
                   "max_num_batched_tokens": max(length, int(engine_options.get("max_num_batched_tokens") or 0))}
        engine = build_engine(**options)
        generator = torch.Generator().manual_seed(seed)
        vocab = engine.runner.shape.vocab_size
        low, high = min(100, vocab // 4), max(vocab - 100, vocab // 2)
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        probe = StepProbe(engine)
        steps = []
        try:
            for index in range(WARMUP_PREFILLS + num_steps):
                prompt = torch.randint(low, high, (length,), generator=generator).tolist()
                engine.add_request(f"prefill-{index}", prompt, params)
                probe.reset()
                probe.step()
                if engine.scheduler.requests:
                    raise RuntimeError(f"a {length}-token prompt did not finish in one step")
                if index >= WARMUP_PREFILLS:
                    steps.append(dict(probe.totals))
        finally:
            probe.close()
            engine.close()
        rows.append((length, {part: 1e3 * statistics.median(s.get(part, 0.0) for s in steps) for part in steps[0]}))
    print_prefill_rows(rows)
    return rows


def print_prefill_rows(rows: list[tuple[int, dict[str, float]]]) -> None:
    print("| prefill tokens | step ms | prompt tok/s | attention | linears | other | prep | sampler | scheduler "
          "| engine |\n|---|---|---|---|---|---|---|---|---|---|")
    for length, ms in rows:
        step = ms.get("step", 0.0)
        rate = f"{length / step * 1e3:.0f}" if step > 0 else "-"
        print(f"| {length} | {step:.1f} | {rate} | " + " | ".join(f"{value:.1f}" for value in step_parts(ms).values())
              + " |")
