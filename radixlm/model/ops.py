"""The C++ extension `radixlm._C` (built from csrc/ by setup.py): loading it, and the fake kernels of its ops.

Every caller of `torch.ops.radixlm.*` or of the extension's direct entry points goes through this module:
`extension_error()` (or `kernels_available()`) first, which imports the extension once and registers a fake kernel
for each of its ops, so `torch.compile` treats them as opaque; then `torch.ops.radixlm.<op>` or `direct_kernel(name)`.
Without the extension (RADIXLM_NO_EXT=1, or a failed build) every caller keeps its PyTorch path.

The ops (csrc/bindings.cpp registers them all): `paged_decode_attention` and `write_kv` (csrc/attention/),
`small_batch_linear`, `small_batch_int8_linear`, `int8_normalize_rows`, `int8_rescale_rows_`, `amx_bf16_linear`,
`gguf_linear` and `gguf_rows` (csrc/linear/), `rms_norm` and `rotary` (csrc/norm/), `silu_and_mul` (csrc/activation/).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch


@cache
def extension_error() -> str | None:
    """None when the extension imports (its ops are then registered, each with a fake kernel), else why it does
    not. Imports it on the first call only."""
    try:
        import radixlm._C  # noqa: F401  (importing registers torch.ops.radixlm.*)
    except ImportError as error:
        return str(error)
    for name, fake in _FAKE_KERNELS:
        torch.library.register_fake(f"radixlm::{name}")(fake)
    return None


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
    "avx512_bf16_available"). Needs the extension (see `extension_error`)."""
    import radixlm._C

    return getattr(radixlm._C, name)


def _fake_same_shape(query: torch.Tensor, *args: object) -> torch.Tensor:
    return query.new_empty(query.shape)


def _fake_no_result(*args: object) -> None:
    return None


def _fake_rms_norm(x: torch.Tensor, *args: object) -> torch.Tensor:  # pad_rows: the same shape
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_linear(x: torch.Tensor, weight: torch.Tensor, *args: object) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _fake_packed_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, *args: object) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


def _fake_normalize_rows(x: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0] + 1, x.shape[1])


def _fake_rotary(query_key: torch.Tensor, *args: object) -> torch.Tensor:
    batch, heads, tokens, head_dim = query_key.shape
    return query_key.new_empty(batch, tokens, heads, head_dim).permute(0, 2, 1, 3)


def _fake_silu_and_mul(gate_up: torch.Tensor, pad_rows: bool = False) -> torch.Tensor:
    return gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)


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
    ("bf16_dot_linear", _fake_linear),
    ("bf16_packed_linear", _fake_packed_linear),
    ("gguf_linear", _fake_gguf_linear),
    ("gguf_rows", _fake_gguf_rows),
    ("rms_norm", _fake_rms_norm),
    ("rotary", _fake_rotary),
    ("silu_and_mul", _fake_silu_and_mul),
)
