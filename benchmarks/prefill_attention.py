"""One layer's causal attention over a prefill chunk: our AVX-512 BF16 kernel (`torch.ops.radixlm.prefill_attention`,
on the dot product and, where the CPU has AMX-BF16, on tiles) against PyTorch's SDPA on the same bfloat16 tensors,
with each one's TFLOP/s (the causal half of the products).

    .venv/bin/python benchmarks/prefill_attention.py [--lens 256,1000,2000] [--heads 9/3] [--head-dim 64]
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from radixlm.model.attention.prefill_kernel import kernel_takes, prefill_kernel_available, prefill_tiles_available


def mean_ms(run: Callable[[], object], repeats: int) -> float:
    for _ in range(2):
        run()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - start) / repeats * 1e3


def time_length(length: int, num_heads: int, num_kv_heads: int, dim: int,
                paths: list[bool]) -> tuple[float, list[float]]:
    """(SDPA ms, the kernel's ms on each of `paths`: tiles or not) for one layer of `length` tokens."""
    q = torch.randn(num_heads, length, dim).to(torch.bfloat16)
    k, v = (torch.randn(num_kv_heads, length, dim).to(torch.bfloat16) for _ in "kv")
    out = torch.empty(length, num_heads, dim, dtype=torch.bfloat16)
    repeats = 3 if length >= 1000 else 20
    sdpa = mean_ms(lambda: F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True),
                   repeats)
    kernel = [mean_ms(functools.partial(torch.ops.radixlm.prefill_attention, q.transpose(0, 1), k.transpose(0, 1),
                                        v.transpose(0, 1), out, dim ** -0.5, 0, 0.0, tiles), repeats)
              for tiles in paths]
    return sdpa, kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lens", default="256,1000,2000")
    parser.add_argument("--heads", default="9/3", help="query heads / KV heads")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--num-threads", type=int, default=2)
    args = parser.parse_args()
    if not prefill_kernel_available():
        raise SystemExit("this CPU has no AVX-512 BF16 (or radixlm._C is not built)")
    torch.set_num_threads(args.num_threads)
    num_heads, num_kv_heads = (int(h) for h in args.heads.split("/"))
    dim = args.head_dim
    paths = [False, True] if prefill_tiles_available() and kernel_takes(dim) else [False]
    for length in (int(n) for n in args.lens.split(",")):
        gflop = num_heads * length * length / 2 * dim * 4 / 1e9
        sdpa, kernel = time_length(length, num_heads, num_kv_heads, dim, paths)
        for tiles, ms in zip(paths, kernel, strict=True):
            print(f"{length} tokens, {num_heads}/{num_kv_heads} heads of {dim}: SDPA {sdpa:.2f} ms "
                  f"({gflop / sdpa:.3f} TFLOP/s), kernel on {'tiles' if tiles else 'the dot product'} {ms:.2f} ms "
                  f"({gflop / ms:.3f}); {sdpa / ms:.2f}x")

if __name__ == "__main__":
    main()
