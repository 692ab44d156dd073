"""The GGUF linear's kernel on a file's own tensors, next to this CPU's dot-product peaks.

Prints (1) how many dot-product instructions a core retires a nanosecond, measured by a loop of independent ones
(a C file compiled here with the system's gcc), for those the CPU has: AVX-512 VNNI `vpdpbusd` (64 int8 multiply-adds),
AVX-512 BF16 `vdpbf16ps` (32 bfloat16 ones), AVX2 `vpmaddubsw` (32 int8 ones), and `vpdpbusd` interleaved with a
float `vfmadd` (do they share the vector pipes?); then (2) the kernel's GOP/s (2 x multiply-adds) on one tensor of each
block type in the file at each row count, and its share of the int8 peak of the path it ran (`RADIXLM_KERNEL_ISA=avx2`
forces the AVX2 path).

    .venv/bin/python benchmarks/gguf_kernel.py --model 1b-q4_k_m.gguf --rows 1,16,256 --threads 2
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from radixlm.model.device import keep_freed_host_memory
from radixlm.model.gguf_blocks import BLOCK_FORMATS
from radixlm.model.gguf_file import TensorInfo, read_gguf
from radixlm.model.ops import kernel_isa

# One loop per probe: `count` iterations of 8 independent instructions (each writes its own register, so none waits
# for another; the sources, registers 0 and 1, are zeroed first); the interleaved probe has 4 of each kind.
LOOP = """
static double {name}(long count) {{
  double t0 = now();
  __asm__ volatile("{zero} %%{reg}0, %%{reg}0, %%{reg}0\\n {zero} %%{reg}1, %%{reg}1, %%{reg}1\\n"
                   "mov %0, %%rcx\\n1:\\n" {body} "dec %%rcx\\n jnz 1b\\n" :: "r"(count)
                   : "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9");
  return 8.0 * count / (now() - t0) / 1e9;
}}
"""
PROBES = {  # name: (the instructions of one loop body, the CPU feature gcc's __builtin_cpu_supports checks)
    "vpdpbusd_zmm": (["vpdpbusd %%zmm0, %%zmm1, %%zmm{r}"] * 8, "avx512vnni"),
    "vdpbf16ps_zmm": (["vdpbf16ps %%zmm0, %%zmm1, %%zmm{r}"] * 8, "avx512bf16"),
    "vpdpbusd_and_vfmadd_zmm": (["vpdpbusd %%zmm0, %%zmm1, %%zmm{r}", "vfmadd231ps %%zmm0, %%zmm1, %%zmm{r}"] * 4,
                                "avx512vnni"),
    "vpmaddubsw_ymm": (["vpmaddubsw %%ymm0, %%ymm1, %%ymm{r}"] * 8, "avx2"),
}
MACS = {"vpdpbusd_zmm": 64, "vdpbf16ps_zmm": 32, "vpmaddubsw_ymm": 32}


def _probe_source() -> str:
    parts = ["#include <time.h>\n",
             "static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); "
             "return t.tv_sec + t.tv_nsec * 1e-9; }\n"]
    for name, (instructions, feature) in PROBES.items():
        body = " ".join(f'"{ins.format(r=2 + i)}\\n"' for i, ins in enumerate(instructions))
        wide = "zmm" in instructions[0]
        parts.append(LOOP.format(name=f"loop_{name}", body=body, reg="zmm" if wide else "ymm",
                                 zero="vpxord" if wide else "vpxor"))
        parts.append(f"double probe_{name}(long count) {{ __builtin_cpu_init(); "
                     f"return __builtin_cpu_supports(\"{feature}\") ? loop_{name}(count) : -1.0; }}\n")
    return "".join(parts)


def instruction_rates(count: int = 50_000_000) -> dict[str, float]:
    """Instructions a nanosecond on one core for each probe the CPU supports (best of three loops)."""
    with tempfile.TemporaryDirectory() as tmp:
        source, library = Path(tmp) / "probes.c", Path(tmp) / "probes.so"
        source.write_text(_probe_source())
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
        probes = ctypes.CDLL(str(library))
        rates = {}
        for name in PROBES:
            function = getattr(probes, f"probe_{name}")
            function.restype, function.argtypes = ctypes.c_double, [ctypes.c_long]
            best = max(function(count) for _ in range(3))
            if best > 0:
                rates[name] = best
    return rates


def file_tensors(path: str) -> dict[str, tuple[int, torch.Tensor, int]]:
    """One 2-D tensor of each block type in the GGUF file: type name -> (ggml type, its rows of blocks, in_features);
    the largest one a decoder layer holds, so that it is a real shape."""
    chosen: dict[str, TensorInfo] = {}
    for tensor in read_gguf(Path(path)).tensors:
        if len(tensor.shape) != 2 or not tensor.name.startswith("blk.") or tensor.ggml_type not in BLOCK_FORMATS:
            continue
        name = BLOCK_FORMATS[tensor.ggml_type].name
        if name not in chosen or chosen[name].num_bytes < tensor.num_bytes:
            chosen[name] = tensor
    with open(path, "rb") as file:
        result = {}
        for name, tensor in chosen.items():
            file.seek(tensor.offset)
            rows = torch.frombuffer(bytearray(file.read(tensor.num_bytes)), dtype=torch.uint8)
            result[name] = (tensor.ggml_type, rows.reshape(tensor.shape[0], -1), tensor.shape[1])
    return result


def kernel_rates(path: str, row_counts: list[int], seconds: float) -> list[tuple[str, list[int], int, float]]:
    """(block type, [out, in], rows, GOP/s) for each tensor of `file_tensors` and row count."""
    from radixlm.model.gguf_linear import GGUFLinear, WeightPart, gguf_kernels
    kernels = gguf_kernels()
    if kernels is None:
        raise SystemExit("radixlm._C is not built: bash scripts/install.sh")
    results = []
    for name, (ggml_type, rows, in_features) in file_tensors(path).items():
        linear = GGUFLinear([WeightPart.from_rows(ggml_type, rows, in_features, packed=True)], kernels=kernels)
        for num_rows in row_counts:
            x = torch.randn(num_rows, in_features)
            linear(x)
            calls, start = 0, time.perf_counter()
            while calls == 0 or time.perf_counter() - start < seconds:
                linear(x)
                calls += 1
            per_call = (time.perf_counter() - start) / calls
            gops = 2 * num_rows * in_features * linear.out_features / per_call / 1e9
            results.append((name, [linear.out_features, in_features], num_rows, gops))
    return results


MAX_ROWS, MAX_SECONDS = 4096, 60.0


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The row counts; exits through `parser.error` (a usage message, status 2) on any value out of range."""
    if not Path(args.model).is_file():
        parser.error(f"--model: no such file: {args.model[:200]}")
    try:
        row_counts = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows must be comma-separated integers, got {args.rows[:200]!r}")
    if not row_counts or len(row_counts) > 16 or not all(1 <= r <= MAX_ROWS for r in row_counts):
        parser.error(f"--rows takes 1 to 16 counts in [1, {MAX_ROWS}], got {args.rows[:200]!r}")
    if not 1 <= args.threads <= 1024:
        parser.error(f"--threads must be in [1, 1024], got {args.threads}")
    if not 0 < args.seconds <= MAX_SECONDS:  # false for NaN too
        parser.error(f"--seconds must be in (0, {MAX_SECONDS:g}], got {args.seconds}")
    return row_counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a GGUF file (its block types are measured)")
    parser.add_argument("--rows", default="1,16,256", help="activation rows per call, comma-separated")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    args = parser.parse_args()
    row_counts = _check_args(parser, args)
    torch.set_num_threads(args.threads)
    keep_freed_host_memory()  # as the engine does: a many-row call's output reuses the heap, no fresh pages
    rates = instruction_rates()
    for name, rate in rates.items():
        macs = f", {rate * MACS[name]:.0f} G multiply-adds/s a core" if name in MACS else ""
        print(f"{name}: {rate:.2f} a ns{macs}")
    if "vpdpbusd_zmm" in rates and "vpdpbusd_and_vfmadd_zmm" in rates:
        print(f"vpdpbusd and vfmadd interleaved retire {rates['vpdpbusd_and_vfmadd_zmm'] / rates['vpdpbusd_zmm']:.2f}x "
              "the instructions of vpdpbusd alone (1: they share the pipes, so each float multiply a kernel does "
              "per K-block and row takes the place of a vpdpbusd; 2: separate pipes)")
    isa = str(kernel_isa())
    peak_name = "vpdpbusd_zmm" if isa == "avx512" and "vpdpbusd_zmm" in rates else "vpmaddubsw_ymm"
    peak = 2 * rates.get(peak_name, 0.0) * MACS[peak_name] * args.threads
    print(f"\nkernel path {isa}, {args.threads} threads; int8 peak ({peak_name}, all threads): {peak:.0f} GOP/s")
    print("| block type | weight [out, in] | rows | GOP/s | of the peak |\n|---|---|---|---|---|")
    for name, shape, num_rows, gops in kernel_rates(args.model, row_counts, args.seconds):
        share = f"{gops / peak:.0%}" if peak else "-"
        print(f"| {name} | {shape} | {num_rows} | {gops:.0f} | {share} |")


if __name__ == "__main__":
    main()
