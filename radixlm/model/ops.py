"""The C++ extension (built from csrc/ by setup.py): choosing its build for this CPU, loading it, and the fake kernels
of its ops.

setup.py builds the same sources twice: `radixlm._C` for AVX2 CPUs (x86-64-v3: AVX2, FMA, F16C) and
`radixlm._C_avx512` for CPUs with AVX-512 VNNI and BF16 (Zen 4 and later, Xeons from Cooper Lake), so one install
runs on either; the kernels that test the build's instruction set (`#if RADIXLM_BUILD_AVX512` in csrc/isa.h) get their
AVX-512 code only in the second. `kernel_isa()` says which one this process loads: the AVX-512 one where the CPU has
what it was built for, else the AVX2 one; a CPU without AVX2 loads neither. Kernels that choose their path at run
time (the GGUF and bfloat16 linears, the prefill attention: csrc/isa.h) do so in either build.
RADIXLM_KERNEL_ISA=avx2 makes a process run as on an AVX2-only CPU (to compare the two, or to test the AVX2 code on
an AVX-512 machine): the AVX2 build, and no AVX-512 path chosen at run time either (csrc/isa.h's avx2_forced).

Every caller of `torch.ops.radixlm.*` or of the extension's direct entry points goes through this module:
`extension_error()` (or `kernels_available()`) first, which imports the extension once and registers a fake kernel
for each of its ops, so `torch.compile` treats them as opaque; then `torch.ops.radixlm.<op>` or `direct_kernel(name)`.
Without the extension (RADIXLM_NO_EXT=1, a failed build, a CPU without AVX2) every caller keeps its PyTorch path.

The ops (csrc/bindings.cpp registers them all): `paged_decode_attention` and `write_kv` (csrc/attention/),
`small_batch_linear`, `small_batch_int8_linear`, `int8_normalize_rows`, `int8_rescale_rows_`, `amx_bf16_linear`,
`gguf_linear` and `gguf_rows` (csrc/linear/), `rms_norm` and `rotary` (csrc/norm/), `silu_and_mul` (csrc/activation/),
`greedy_tokens` (csrc/sample/).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from functools import cache
from types import ModuleType

import torch

KERNEL_ISA_VARIABLE = "RADIXLM_KERNEL_ISA"
# Build name -> the extension module built for it (setup.py's VARIANTS).
EXTENSION_MODULES = {"avx512": "radixlm._C_avx512", "avx2": "radixlm._C"}


@cache
def kernel_isa() -> str | None:
    """"avx512" or "avx2": the extension build this CPU runs (see the module docstring), or None without AVX2.
    Reads the CPU through PyTorch's cpuinfo (the CPUID instruction, as the kernels' own checks do)."""
    forced = os.environ.get(KERNEL_ISA_VARIABLE, "")
    if forced not in ("", "avx2"):
        raise ValueError(f"{KERNEL_ISA_VARIABLE} must be unset or 'avx2', got {forced[:40]!r}")
    cpu = torch.cpu
    if not cpu._is_avx2_supported():
        return None
    if (not forced and cpu._is_avx512_supported() and cpu._is_vnni_supported()
            and cpu._is_avx512_bf16_supported()):
        return "avx512"
    return "avx2"


@cache
def extension_error() -> str | None:
    """None when the extension imports (its ops are then registered, each with a fake kernel), else why it does
    not. Imports it on the first call only."""
    isa = kernel_isa()
    if isa is None:
        return "this CPU has no AVX2, which every build of radixlm's C++ kernels needs"
    try:
        importlib.import_module(EXTENSION_MODULES[isa])  # importing registers torch.ops.radixlm.*
    except ImportError as error:
        return str(error)
    for name, fake in _FAKE_KERNELS:
        torch.library.register_fake(f"radixlm::{name}")(fake)
    return None


def extension() -> ModuleType:
    """The extension module this CPU runs (see `kernel_isa`). Needs it built (see `extension_error`)."""
    error = extension_error()
    if error is not None:
        raise RuntimeError(f"radixlm's C++ kernels are not available: {error}")
    return importlib.import_module(EXTENSION_MODULES[str(kernel_isa())])  # loaded: kernel_isa() named a build


def kernels_available() -> bool:
    """True when radixlm._C imports (see `extension_error`)."""
    return extension_error() is None


@cache
def direct_kernel(name: str) -> Callable[..., torch.Tensor]:
    """The extension's direct entry point `name` (csrc/bindings.cpp: "small_batch_linear", "small_batch_int8_linear",
    "int8_normalize_rows", "int8_rescale_rows_", "rms_norm", "rotary", "silu_and_mul", "amx_bf16_linear",
    "bf16_dot_linear", "bf16_packed_linear", "gguf_linear", "gguf_rows": the arguments and result of
    `torch.ops.radixlm.<name>`, without the dispatcher; "rms_norm_padded", "silu_and_mul_padded": those ops with
    pad_rows=True; "decode_attention": one decode layer, see
    `radixlm.model.attention.cpp_backend.decode_layer`; "gguf_linear_paths"; "amx_bf16_available";
    "avx512_bf16_available"; "greedy_tokens" (csrc/sample/); "decode_plan", "decode_layers": see
    `radixlm.model.decode_stack`). Needs the extension (see `extension_error`)."""
    return getattr(extension(), name)


def _fake_same_shape(query: torch.Tensor, *args: object) -> torch.Tensor:
    return query.new_empty(query.shape)


def _fake_no_result(*args: object) -> None:
    return None


def _fake_rms_norm(x: torch.Tensor, *args: object) -> torch.Tensor:  # pad_rows: the same shape
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_linear(x: torch.Tensor, weight: torch.Tensor, *args: object) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _fake_gated_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0] // 2)


def _fake_packed_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, *args: object) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


def _fake_normalize_rows(x: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0] + 1, x.shape[1])


def _fake_rotary(query_key: torch.Tensor, *args: object) -> torch.Tensor:
    batch, heads, tokens, head_dim = query_key.shape
    return query_key.new_empty(batch, tokens, heads, head_dim).permute(0, 2, 1, 3)


def _fake_silu_and_mul(gate_up: torch.Tensor, pad_rows: bool = False, blocks16: bool = False) -> torch.Tensor:
    return gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)


def _fake_greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    return logits.new_empty(logits.shape[0], dtype=torch.long)


def _fake_gguf_linear(x: torch.Tensor, tiles: list[torch.Tensor], types: list[int], out_features: list[int],
                      *args: object) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], sum(out_features))


def _fake_gguf_rows(tiles: torch.Tensor, ggml_type: int, in_features: int, out_features: int,
                    ids: torch.Tensor) -> torch.Tensor:
    return tiles.new_empty(ids.numel(), in_features, dtype=torch.float32)


# Every op of csrc/bindings.cpp and its fake kernel (the output's shape and dtype, computed without running it).
_FAKE_KERNELS: tuple[tuple[str, Callable[..., torch.Tensor | None]], ...] = (
    ("paged_decode_attention", _fake_same_shape),
    ("write_kv", _fake_no_result),
    ("prefill_attention", _fake_no_result),
    ("prefill_attention_paged", _fake_no_result),
    ("small_batch_linear", _fake_linear),
    ("small_batch_int8_linear", _fake_linear),
    ("int8_normalize_rows", _fake_normalize_rows),
    ("int8_rescale_rows_", _fake_no_result),
    ("amx_bf16_linear", _fake_linear),
    ("amx_bf16_gated_linear", _fake_gated_linear),
    ("bf16_dot_linear", _fake_linear),
    ("bf16_packed_linear", _fake_packed_linear),
    ("gguf_linear", _fake_gguf_linear),
    ("gguf_rows", _fake_gguf_rows),
    ("gguf_pack_tiles", _fake_no_result),
    ("rms_norm", _fake_rms_norm),
    ("rotary", _fake_rotary),
    ("silu_and_mul", _fake_silu_and_mul),
    ("greedy_tokens", _fake_greedy_tokens),
)
