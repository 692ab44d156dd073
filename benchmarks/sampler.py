"""The sampler's time per decode step next to the model forward of the same step.

64 requests (by default) are prefilled, then each measured step is one decode forward of all of them followed by
the sampler on its logits, every transform on. The sampler runs once per variant on the step's logits, so all
variants see the same distributions; the composition stays fixed, so per-row tensors are reused after the first
step (the `rebuilt` variant builds them every step, as when the batch changes each step).

    .venv/bin/python benchmarks/sampler.py [--num-requests 64] [--num-steps 10] [engine flags]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from radixlm.core.step import ModelRunnerOutput
from radixlm.engine.llm_engine import LLMEngine, build_engine
from radixlm.engine_args import add_engine_args, engine_kwargs
from radixlm.request import Request
from radixlm.sample.sampler import Sampler
from radixlm.sampling_params import SamplingParams


def all_transforms(seed: int, eos_token_id: int) -> SamplingParams:
    """Every stage active at every step: bias, min_tokens ban, the three penalties, T, min_p, top-k, top-p,
    a seeded stream and 5 logprobs."""
    return SamplingParams(temperature=0.8, min_p=0.02, top_k=50, top_p=0.9, repetition_penalty=1.1,
                          frequency_penalty=0.3, presence_penalty=0.3, logit_bias={eos_token_id + i: -1.0
                                                                                   for i in range(1, 6)},
                          min_tokens=64, max_tokens=10_000, stop_token_ids=[eos_token_id + 10], seed=seed,
                          logprobs=5)


VARIANTS: dict[str, Callable[[SamplingParams], SamplingParams]] = {
    "all transforms": lambda p: p,
    "all, rebuilt per step": lambda p: p,
    "top-p without top-k": lambda p: p.replace(top_k=0),
    "greedy, nothing else": lambda p: SamplingParams(temperature=0.0, max_tokens=10_000),
}


def _prefill(engine: LLMEngine, num_requests: int, prompt_len: int, seed: int) -> list[Request]:
    generator = torch.Generator().manual_seed(seed)
    eos = min(engine.eos_token_ids or {0})
    vocab = engine.runner.shape.vocab_size
    for i in range(num_requests):
        prompt = torch.randint(100, vocab - 100, (prompt_len,), generator=generator).tolist()
        engine.add_request(f"bench-{i}", prompt, all_transforms(i, eos))
    while any(r.num_uncomputed_tokens != 1 or not r.num_output_tokens for r in engine.scheduler.requests.values()):
        engine.step()
    return [engine.scheduler.requests[f"bench-{i}"] for i in range(num_requests)]


def _timed(fn: Callable[..., object], *args: object) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def bench_sampler(engine_options: dict, num_requests: int, prompt_len: int, num_steps: int, seed: int) -> None:
    """Prefill `num_requests` random prompts, then time `num_steps` decode steps (after one uncounted step): the
    forward, and each variant's sampler on that step's logits; print a row per variant with the medians."""
    engine = build_engine(**{"max_num_seqs": num_requests, **engine_options})
    requests = _prefill(engine, num_requests, prompt_len, seed)
    vocab = engine.runner.shape.vocab_size
    variant_requests = {name: [_with_params(r, make(r.sampling_params)) for r in requests]
                        for name, make in VARIANTS.items()}
    samplers = {name: Sampler(vocab) for name in VARIANTS}
    forward_times: list[float] = []
    sampler_times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    scheduler = engine.scheduler
    for _ in range(num_steps + 1):  # the first step builds every variant's tensors: not counted
        output = scheduler.schedule()
        assert len(output.chunks) == num_requests and output.num_scheduled_tokens == num_requests
        tables = {c.request_id: scheduler.requests[c.request_id].block_table for c in output.chunks}
        forward, result = _timed(engine.runner.execute, output.chunks, tables)
        logits = result.logits  # type: ignore[attr-defined]
        for name, sampler in samplers.items():
            if name == "all, rebuilt per step":
                sampler._batch = None
            elapsed, sampled = _timed(sampler, logits.clone(), variant_requests[name])
            sampler_times[name].append(elapsed)
            if name == "all transforms":
                last_tokens = sampled.token_ids  # type: ignore[attr-defined]
        forward_times.append(forward)
        sampling = output.sampling_request_ids
        scheduler.update_from_output(output, ModelRunnerOutput(list(sampling), [[t] for t in last_tokens],
                                                               [None] * len(sampling)))
        for copies in variant_requests.values():  # keep the variants' views in step with the real requests
            for copy, request in zip(copies, requests, strict=True):
                copy.all_token_ids, copy.num_tokens = request.all_token_ids, request.num_tokens
    _report(forward_times[1:], {n: t[1:] for n, t in sampler_times.items()}, num_requests, vocab, prompt_len)


def _with_params(request: Request, params: SamplingParams) -> Request:
    copy = Request(request.request_id, request.prompt_token_ids, params, eos_token_ids=request.eos_token_ids,
                   sampling_seed=request.sampling_seed)
    copy.all_token_ids, copy.num_tokens = request.all_token_ids, request.num_tokens
    return copy


def _report(forward_times: list[float], sampler_times: dict[str, list[float]], num_requests: int, vocab: int,
            prompt_len: int) -> None:
    forward = statistics.median(forward_times)
    print(f"\nsampler vs forward: decode step of {num_requests} requests (contexts ~{prompt_len} tokens), "
          f"vocab {vocab}, torch threads {torch.get_num_threads()}, medians of {len(forward_times)} steps")
    print("| variant | sampler ms/step | forward ms/step | sampler / forward |\n|---|---|---|---|")
    for name, times in sampler_times.items():
        sampler = statistics.median(times)
        print(f"| {name} | {sampler * 1e3:.1f} | {forward * 1e3:.1f} | {sampler / forward:.1%} |")


def main(argv: list[str] | None = None) -> None:
    """Parse the flags (`argv`, default the command line) and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, default=64, help="rows of the decode batch")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--num-steps", type=int, default=10, help="measured decode steps")
    parser.add_argument("--workload-seed", type=int, default=0)
    add_engine_args(parser)
    args = parser.parse_args(argv)
    bench_sampler(engine_kwargs(args), args.num_requests, args.prompt_len, args.num_steps, args.workload_seed)


if __name__ == "__main__":
    main()
