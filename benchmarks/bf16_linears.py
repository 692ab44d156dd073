"""Every bfloat16 linear of a model shape in a row, weights cold (the whole set exceeds the CPU caches), on each path
this CPU runs: our packed AVX-512 BF16 kernel (`DotPackedLinear`), the plain-weight dot kernel, oneDNN's prepacked
copy (`PrepackedLinear`) and `F.linear`; best of a few passes, with the prepacked / packed ratio.

    .venv/bin/python benchmarks/bf16_linears.py [--shape 135m|1b] [--rows 1,16,32,256] [--num-threads 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.bf16_linear import DotPackedLinear, dot_available
from radixlm.model.ops import direct_kernel
from radixlm.model.prepacked_linear import PrepackedLinear

SHAPES = {  # (out, in) of each layer's fused linears, and the number of layers
    "135m": ([(960, 576), (576, 576), (3072, 576), (576, 1536)], 30),
    "1b": ([(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)], 16),
}


def best_ms(run: Callable[[dict[int, torch.Tensor]], object], inputs: dict[int, torch.Tensor], passes: int) -> float:
    run(inputs)
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        run(inputs)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="135m")
    parser.add_argument("--rows", default="1,16,32,256")
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--num-threads", type=int, default=2)
    args = parser.parse_args()
    if not dot_available():
        raise SystemExit("this CPU has no AVX-512 BF16 (or radixlm._C is not built)")
    torch.set_num_threads(args.num_threads)
    shapes, layers = SHAPES[args.shape]
    linears = [nn.Linear(k, n, bias=False, dtype=torch.bfloat16) for _ in range(layers) for n, k in shapes]
    packed = [DotPackedLinear(linear) for linear in linears]
    prepacked = [PrepackedLinear(linear) for linear in linears]
    dot = direct_kernel("bf16_dot_linear")
    paths = {
        "packed": lambda xs: [m(xs[m.in_features]) for m in packed],
        "dot": lambda xs: [dot(xs[m.in_features], m.weight, None) for m in linears],
        "prepacked": lambda xs: [m(xs[m.in_features]) for m in prepacked],
        "F.linear": lambda xs: [F.linear(xs[m.in_features], m.weight) for m in linears],
    }
    print(f"{args.shape}: {len(linears)} linears, {sum(n * k for n, k in shapes) * layers * 2 / 1e9:.2f} GB of weights")
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = {k: torch.randn(rows, k).to(torch.bfloat16) for _, k in shapes}
        ms = {name: best_ms(run, inputs, args.passes) for name, run in paths.items()}
        figures = ", ".join(f"{name} {value:.1f}" for name, value in ms.items())
        print(f"{rows} rows: {figures} ms; prepacked / packed {ms['prepacked'] / ms['packed']:.2f}x")


if __name__ == "__main__":
    main()
