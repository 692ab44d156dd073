"""Weights and KV caches on transparent huge pages against the same tensors on ordinary pages, alternated in one
process.

Two measurements, each flipping one placement back and forth so that the machine's drifting memory speed hits both
alike: (1) greedy batch-1 generations of an engine whose linears' streamed tensors (their `weight`, or the packed
bfloat16 weight: `--dtype bfloat16`) are swapped between the copies the engine made at load and plain clones;
(2) decode attention alone (`benchmarks/attention.py`'s synthetic caches) over the cache's own tensors (on huge
pages) against plain clones of them, the CPU caches flushed before each step. Prints medians, and how many pairs
huge pages won.

    .venv/bin/python -m benchmarks.huge_pages [--pairs 10] [--output-len 96] [--skip-attention] [engine flags]

(As a module, not a script: it builds on `benchmarks/attention.py`'s synthetic caches.)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.attention import AttentionShape, _Layer, _step_metadata
from radixlm.bench.step_probe import linear_modules
from radixlm.engine_args import add_engine_args, engine_kwargs
from radixlm.llm import LLM
from radixlm.model.attention import paged_attention
from radixlm.sampling_params import SamplingParams

FLUSH_BYTES = 64 << 20  # more than the last-level caches of this project's machines


def alternate(runs: dict[str, Callable[[], float]], pairs: int) -> dict[str, list[float]]:
    """Each run once per pair, in turn (after one warm-up pair); the seconds of each."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for pair in range(pairs + 1):
        for name, run in runs.items():
            elapsed = run()
            if pair:
                seconds[name].append(elapsed)
    return seconds


def report(title: str, seconds: dict[str, list[float]], unit_scale: float, unit: str) -> None:
    plain, huge = seconds["plain"], seconds["huge"]
    wins = sum(h < p for p, h in zip(plain, huge, strict=True))
    plain_median, huge_median = statistics.median(plain), statistics.median(huge)
    print(f"{title}: plain {plain_median * unit_scale:.2f} {unit}, huge pages {huge_median * unit_scale:.2f} {unit} "
          f"({plain_median / huge_median:.3f}x; huge pages faster in {wins} of {len(plain)} pairs)")


def streamed_tensor(module: nn.Module) -> str | None:
    """The attribute holding what a linear streams at batch 1: the packed bfloat16 weight, or `weight`."""
    if isinstance(getattr(module, "packed", None), torch.Tensor):
        return "packed"
    return "weight" if isinstance(getattr(module, "weight", None), torch.Tensor) else None


def weights_ab(llm: LLM, pairs: int, output_len: int) -> None:
    """Batch-1 greedy generation, the linears' streamed tensors swapped between their load-time copies and plain
    clones (a tied embedding's weight with its LM head's)."""
    model = llm.engine.runner.model
    slots = [(m, name) for m in linear_modules(model) if (name := streamed_tensor(m)) is not None]
    embedding = model.get_input_embeddings()
    loaded = {id(getattr(m, name)): getattr(m, name) for m, name in slots}
    plain = {key: (nn.Parameter(t.detach().clone(), requires_grad=False) if isinstance(t, nn.Parameter)
                   else t.clone()) for key, t in loaded.items()}
    keys = [id(getattr(m, name)) for m, name in slots]
    embedding_key = id(embedding.weight)

    def use(table: dict[int, torch.Tensor]) -> None:
        for (module, name), key in zip(slots, keys, strict=True):
            setattr(module, name, table[key])
        if embedding_key in table:
            embedding.weight = table[embedding_key]

    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    prompt = list(range(100, 164))

    def run(table: dict[int, torch.Tensor]) -> Callable[[], float]:
        def timed() -> float:
            use(table)
            start = time.perf_counter()
            llm.generate([prompt], params, use_tqdm=False)
            return (time.perf_counter() - start) / output_len
        return timed

    report(f"batch-1 generation, {len(slots)} linears", alternate({"plain": run(plain), "huge": run(loaded)}, pairs),
           1e3, "ms a token")
    use(loaded)


def attention_ab(shape: AttentionShape, batch: int, context_len: int, dtype: torch.dtype, pairs: int) -> None:
    """One decode step's attention over every layer, the caches swapped between plain and huge-page copies."""
    cache, metadata = _step_metadata(shape, batch, context_len, 0, dtype, kernel=True)
    # PagedKVCache puts its CPU tensors on huge pages (the placement measured); clones sit on ordinary pages.
    huge = (list(cache.key_caches), list(cache.value_caches))
    plain = ([t.clone() for t in huge[0]], [t.clone() for t in huge[1]])
    query = torch.randn(1, shape.num_heads, batch, shape.head_dim).to(dtype)
    key, value = torch.randn(2, 1, shape.num_kv_heads, batch, shape.head_dim).to(dtype)
    layers = [_Layer(i % shape.distinct_layers) for i in range(shape.num_layers)]
    flush = torch.zeros(FLUSH_BYTES, dtype=torch.uint8)

    def run(caches: tuple[list[torch.Tensor], list[torch.Tensor]]) -> Callable[[], float]:
        def timed() -> float:
            cache.key_caches[:], cache.value_caches[:] = caches
            flush.add_(1)
            start = time.perf_counter()
            for layer in layers:
                paged_attention(layer, query, key, value, None, scaling=shape.head_dim ** -0.5, radix_attn=metadata)
            return time.perf_counter() - start
        return timed

    with torch.inference_mode():
        seconds = alternate({"plain": run(plain), "huge": run(huge)}, pairs)
    report(f"attention, Hq/Hkv {shape.num_heads}/{shape.num_kv_heads}, batch {batch}, {context_len} positions, "
           f"{str(dtype).removeprefix('torch.')}", seconds, 1e3, "ms")


def main(argv: list[str] | None = None) -> None:
    """Parse the flags (`argv`, default the command line) and run both measurements."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=10, help="alternations of the two placements")
    parser.add_argument("--output-len", type=int, default=96, help="tokens a timed generation")
    parser.add_argument("--skip-attention", action="store_true", help="only the weights' measurement")
    add_engine_args(parser)
    args = parser.parse_args(argv)
    llm = LLM(**engine_kwargs(args))
    weights_ab(llm, args.pairs, args.output_len)
    llm.close()
    if args.skip_attention:
        return
    small = AttentionShape(num_layers=30, distinct_layers=30)  # the default model's
    llama_1b = AttentionShape(num_layers=16, num_heads=32, num_kv_heads=8, distinct_layers=16)
    for shape, batch, context_len, dtype in ((small, 1, 1024, torch.float32), (small, 32, 256, torch.bfloat16),
                                             (llama_1b, 1, 1056, torch.bfloat16), (llama_1b, 16, 512, torch.bfloat16)):
        attention_ab(shape, batch, context_len, dtype, args.pairs)


if __name__ == "__main__":
    main()
