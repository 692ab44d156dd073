"""`radixlm bench offline`: radixlm against HF `generate` with static batches, same model, same run."""

from __future__ import annotations

import gc
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from radixlm.bench.workload import BenchRequest, random_requests
from radixlm.llm import LLM
from radixlm.model.loader import float32_checkpoint, load_tokenizer, resolve_model_dir
from radixlm.sampling_params import SamplingParams


@dataclass
class RunResult:
    engine: str
    batch_size: int | None
    seconds: float
    output_tokens: int
    prompt_tokens: int

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.seconds


def run_radixlm(llm: LLM, requests: list[BenchRequest]) -> RunResult:
    params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in requests]
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate([r.prompt_token_ids for r in requests], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert produced == sum(r.output_len for r in requests), "radixlm produced the wrong number of tokens"
    return RunResult("radixlm", None, seconds, produced, sum(len(r.prompt_token_ids) for r in requests))


def run_hf_static(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, requests: list[BenchRequest],
                  batch_size: int) -> RunResult:
    """HF generate over fixed batches in arrival order, left-padded; a batch runs until its longest output."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    start = time.perf_counter()
    for first in range(0, len(requests), batch_size):
        batch = requests[first:first + batch_size]
        width = max(len(r.prompt_token_ids) for r in batch)
        input_ids = torch.tensor([[pad_id] * (width - len(r.prompt_token_ids)) + r.prompt_token_ids for r in batch])
        attention_mask = torch.tensor([[0] * (width - len(r.prompt_token_ids)) + [1] * len(r.prompt_token_ids)
                                       for r in batch])
        new_tokens = max(r.output_len for r in batch)
        with torch.inference_mode():
            model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id)
    seconds = time.perf_counter() - start
    return RunResult("hf-static", batch_size, seconds, sum(r.output_len for r in requests),
                     sum(len(r.prompt_token_ids) for r in requests))


def parallel_runs(engine_options: dict, data_parallel: bool, tensor_parallel: bool = False) -> list[tuple[str, dict]]:
    """The engine settings `--compare-data-parallel` / `--compare-tensor-parallel` run on the same cores: one engine
    with every thread, then two replicas (each worker in its own process) and/or two tensor-parallel ranks, with
    half of the threads each."""
    threads = max(2, int(engine_options.get("num_threads") or 2))
    options = {k: v for k, v in engine_options.items()
               if k not in ("num_threads", "data_parallel_size", "tensor_parallel_size")}
    half = threads // 2
    each = f"{half} thread{'s' if half > 1 else ''}"
    kinds = [kind for kind, on in (("dp", data_parallel), ("tp", tensor_parallel)) if on]
    base = f"{kinds[0]}=1" if len(kinds) == 1 else "1 engine"
    runs = [(f"radixlm {base} x {threads} threads", options | {"num_threads": threads})]
    if data_parallel:
        runs.append((f"radixlm dp=2 x {each}", options | {"num_threads": half, "data_parallel_size": 2}))
    if tensor_parallel:
        runs.append((f"radixlm tp=2 x {each}", options | {"num_threads": half, "tensor_parallel_size": 2}))
    return runs


def bench_offline(engine_options: dict, num_prompts: int, input_len: tuple[int, int], output_len: tuple[int, int],
                  hf_batch_sizes: list[int], seed: int, output_json: Path | None,
                  compare_data_parallel: bool = False, compare_tensor_parallel: bool = False) -> list[RunResult]:
    """radixlm (or, with `compare_data_parallel` / `compare_tensor_parallel`, one engine against two replicas and/or
    two tensor-parallel ranks on the same threads, same requests) against HF static batches."""
    compare = compare_data_parallel or compare_tensor_parallel
    runs = parallel_runs(engine_options, compare_data_parallel, compare_tensor_parallel) if compare else \
        [("radixlm", engine_options)]
    results: list[RunResult] = []
    for name, options in runs:
        llm = LLM(**options)
        requests = random_requests(llm.tokenizer, num_prompts, input_len, output_len, seed)
        results.append(replace(run_radixlm(llm, requests), engine=name))
        model_dir = resolve_model_dir(llm.engine.config.model.model)
        llm.close()
        del llm
        gc.collect()
    if hf_batch_sizes:
        hf_model = AutoModelForCausalLM.from_pretrained(float32_checkpoint(model_dir), dtype=torch.float32).eval()
        tokenizer = load_tokenizer(model_dir)
        for batch_size in hf_batch_sizes:
            results.append(run_hf_static(hf_model, tokenizer, requests, batch_size))
    print_table(results, num_prompts, input_len, output_len)
    for result in results[1:len(runs)]:
        print(f"\n{result.engine} vs {results[0].engine}: {result.output_tok_s / results[0].output_tok_s:.2f}x "
              f"output tok/s")
    if output_json:
        output_json.write_text(json.dumps([asdict(r) | {"output_tok_s": r.output_tok_s} for r in results], indent=2))
    return results


def print_table(results: list[RunResult], num_prompts: int, input_len: tuple[int, int],
                output_len: tuple[int, int]) -> None:
    best_hf = max((r for r in results if r.engine == "hf-static"), key=lambda r: r.output_tok_s, default=None)
    print(f"\n{num_prompts} prompts, input {input_len[0]}-{input_len[1]}, output {output_len[0]}-{output_len[1]} "
          f"tokens (ignore_eos, greedy)")
    print("| engine | batch | seconds | output tok/s | radixlm / this |\n|---|---|---|---|---|")
    ours = results[0]
    for r in results:
        ratio = ours.output_tok_s / r.output_tok_s
        batch = r.batch_size or "continuous"
        print(f"| {r.engine} | {batch} | {r.seconds:.1f} | {r.output_tok_s:.1f} | {ratio:.2f}x |")
    if best_hf:
        print(f"\nradixlm vs best HF static batch ({best_hf.batch_size}): "
              f"{ours.output_tok_s / best_hf.output_tok_s:.2f}x")
