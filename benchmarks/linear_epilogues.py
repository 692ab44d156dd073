"""A bfloat16 decoder layer's small work moved into the AMX linears' writes, against the same engine without it, the
modes alternated step by step in one process (this machine's speed drifts by tens of percent within the hour):

- apart: the residual adds after o_proj and down_proj, silu(gate) * up a pass of its own over the gate/up output;
- residual: the adds in the projections' writes (`Bf16Linear.forward_add`);
- both: the adds, and silu(gate) * up in the gate/up projection's writes (`FusedGatedMLP.interleave_halves`).

Each round adds one prompt to `--decode-rows` decoding requests (a mixed step, as a served run admits a request when
another ends), then times the next step (a decode step of them all). Needs a CPU with AMX-BF16.

    .venv/bin/python benchmarks/linear_epilogues.py [--decode-rows 31] [--prompt-len 256] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixlm.engine.llm_engine import build_engine
from radixlm.model import fused_ops
from radixlm.model.bf16_linear import amx_available
from radixlm.sampling_params import SamplingParams

MODES = ("apart", "residual", "both")
CONTEXT = 280  # the decoding requests' prompt length


def residual_apart(linear: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    return linear(x) if residual is None else residual + linear(x)


def positive(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"must be in [1, 4096], got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decode-rows", type=positive, default=31, help="decoding requests (at most 255)")
    parser.add_argument("--prompt-len", type=positive, default=256, help="the new prompt of each mixed step")
    parser.add_argument("--rounds", type=positive, default=15, help="rounds of each mode")
    args = parser.parse_args()
    if args.decode_rows > 255:
        parser.error("--decode-rows must be at most 255")
    if not amx_available():
        parser.error("this CPU has no AMX-BF16 (or radixlm._C is not built): nothing moves into the writes")
    engine = build_engine(dtype="bfloat16", kv_cache_memory="2GiB", max_num_seqs=256,
                          max_num_batched_tokens=max(2048, args.prompt_len + args.decode_rows))
    mlps = [m for m in engine.runner.model.modules() if isinstance(m, fused_ops.FusedGatedMLP)]
    in_the_writes = fused_ops.plus_residual
    generator = torch.Generator().manual_seed(0)
    endless = SamplingParams(temperature=0.0, max_tokens=1_000_000, ignore_eos=True)
    for k in range(args.decode_rows):
        engine.add_request(f"d{k}", torch.randint(100, 40000, (CONTEXT,), generator=generator).tolist(), endless)
    while not all(r.num_output_tokens for r in engine.scheduler.requests.values()):
        engine.step()
    times: dict[tuple[str, str], list[float]] = {(step, mode): [] for step in ("mixed", "decode") for mode in MODES}
    for i in range(3 * (args.rounds + 1)):
        mode = MODES[i % 3]
        fused_ops.plus_residual = residual_apart if mode == "apart" else in_the_writes
        for mlp in mlps:
            mlp.interleave_halves() if mode == "both" else mlp.restore_halves()
        prompt = torch.randint(100, 40000, (args.prompt_len,), generator=generator).tolist()
        engine.add_request(f"p{i}", prompt, SamplingParams(temperature=0.0, max_tokens=2))
        for step in ("mixed", "decode"):
            start = time.perf_counter()
            engine.step()
            if i >= 3:  # the first round of each mode warms up
                times[(step, mode)].append(time.perf_counter() - start)
    fused_ops.plus_residual = in_the_writes
    print(f"{args.decode_rows} decoding rows (+ a {args.prompt_len}-token prompt in the mixed step), "
          f"medians of {args.rounds} rounds, ms:")
    print("| step | " + " | ".join(MODES) + " | apart / both |")
    print("|---|" + "---|" * (len(MODES) + 1))
    for step in ("mixed", "decode"):
        medians = [statistics.median(times[(step, mode)]) * 1e3 for mode in MODES]
        print(f"| {step} | " + " | ".join(f"{m:.1f}" for m in medians) + f" | {medians[0] / medians[2]:.3f}x |")


if __name__ == "__main__":
    main()
