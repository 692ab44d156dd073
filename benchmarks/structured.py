"""Decode step time with N grammar-constrained requests vs N unconstrained ones.

Same prompts, greedy, same number of steps (the grammar forces a long JSON string, and ignore_eos keeps the plain
ones going), runs interleaved in one process; only steps where every request is decoding are timed.

    .venv/bin/python benchmarks/structured.py [--num-requests 32] [--num-tokens 64] [engine flags]
"""

from __future__ import annotations

import argparse
import statistics
import time

from radixlm.engine.llm_engine import LLMEngine, build_engine
from radixlm.engine_args import add_engine_args, engine_kwargs
from radixlm.sampling_params import SamplingParams

LONG_STRING_SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 2000}},
                      "required": ["story"]}


def decode_step_times(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[float]:
    """Seconds per step for the steps in which all requests only decode."""
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, params)
    started: set[str] = set()
    times = []
    while engine.has_unfinished_requests():
        all_decoding = len(started) == len(prompts)
        start = time.perf_counter()
        outputs = engine.step()
        if all_decoding:
            times.append(time.perf_counter() - start)
        started.update(output.request_id for output in outputs)
    return times


def bench_structured(engine_options: dict, num_requests: int, num_tokens: int, repeats: int) -> tuple[float, float]:
    """Print the mean decode step of each setting and the grammar's overhead; returns the mean milliseconds per
    decode step (unconstrained, constrained)."""
    engine = build_engine(**engine_options)
    prompts = [engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Tell story number {i} as JSON."}], add_generation_prompt=True)
        for i in range(num_requests)]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    plain = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    constrained = plain.replace(structured_outputs={"json": LONG_STRING_SCHEMA})
    engine.structured.submit(constrained.structured_outputs).result()  # compile outside the timed steps
    results: dict[str, list[float]] = {"unconstrained": [], "constrained": []}
    for _ in range(repeats):
        for name, params in (("unconstrained", plain), ("constrained", constrained)):
            engine.scheduler.kv_cache_manager.reset_prefix_cache()
            results[name] += decode_step_times(engine, prompts, params)
    plain_ms = statistics.mean(results["unconstrained"]) * 1000
    constrained_ms = statistics.mean(results["constrained"]) * 1000
    print(f"\n{num_requests} requests decoding, {num_tokens} tokens each, {repeats} interleaved runs per setting")
    print("| requests | mean decode step (ms) | steps timed |\n|---|---|---|")
    for name, values in results.items():
        print(f"| {num_requests} {name} | {statistics.mean(values) * 1000:.1f} | {len(values)} |")
    print(f"\ngrammar mask overhead: {constrained_ms / plain_ms - 1:+.1%} per decode step (target <= 5%)")
    return plain_ms, constrained_ms


def main(argv: list[str] | None = None) -> None:
    """Parse the flags (`argv`, default the command line) and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--num-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    add_engine_args(parser)
    args = parser.parse_args(argv)
    bench_structured(engine_kwargs(args), args.num_requests, args.num_tokens, args.repeats)


if __name__ == "__main__":
    main()
