"""`radixlm bench offline --tp-variants 1x2,2x1`: the same random workload through engines of different
tensor-parallel sizes and threads per process (ranks x threads), side by side in one run.

On a CPU the fair comparison holds the cores constant: tensor parallelism 2 with one thread per rank against one
process with two threads. Each engine is built, measured and closed before the next starts.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from radixlm.bench.offline import run_radixlm
from radixlm.bench.workload import random_requests
from radixlm.engine.llm import LLM


@dataclass(frozen=True)
class Variant:
    tensor_parallel_size: int
    num_threads: int

    @classmethod
    def parse(cls, text: str) -> Variant:
        """"2x1": 2 ranks of 1 thread each."""
        ranks, _, threads = text.partition("x")
        if not ranks.isdigit() or not threads.isdigit() or int(ranks) < 1 or int(threads) < 1:
            raise ValueError(f"tp_variants entries are RANKSxTHREADS such as 2x1, got {text!r}")
        return cls(int(ranks), int(threads))

    @property
    def label(self) -> str:
        return f"TP {self.tensor_parallel_size} x {self.num_threads} thread(s)"


def bench_tensor_parallel(engine_options: dict, variants: list[Variant], num_prompts: int,
                          input_len: tuple[int, int], output_len: tuple[int, int], seed: int) -> list[float]:
    """Run every variant on the same requests; prints a table and returns each variant's output tok/s."""
    options = {k: v for k, v in engine_options.items() if k not in ("tensor_parallel_size", "num_threads")}
    rates: list[float] = []
    for variant in variants:
        llm = LLM(**options, tensor_parallel_size=variant.tensor_parallel_size, num_threads=variant.num_threads)
        try:
            requests = random_requests(llm.tokenizer, num_prompts, input_len, output_len, seed)
            result = run_radixlm(llm, requests)
        finally:
            llm.engine.close()
        del llm
        gc.collect()
        rates.append(result.output_tok_s)
        print(f"{variant.label}: {result.seconds:.1f} s, {result.output_tok_s:.1f} output tok/s", flush=True)
    print(f"\n{num_prompts} prompts, input {input_len[0]}-{input_len[1]}, output {output_len[0]}-{output_len[1]} "
          f"tokens (ignore_eos, greedy)")
    print("| variant | output tok/s | vs first |\n|---|---|---|")
    for variant, rate in zip(variants, rates, strict=True):
        print(f"| {variant.label} | {rate:.1f} | {rate / rates[0]:.2f}x |")
    return rates
