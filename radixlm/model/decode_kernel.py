"""The C++ paged decode attention op (`radixlm._C`, built from csrc/) and the choice of attention backend.

`torch.ops.radixlm.paged_decode_attention` attends every decoding request in one call per layer, reading K/V
blocks in place through a flat block table. It is a registered custom op, so `torch.compile` treats it as opaque.
The pure-torch path in `attention.py` stays the reference and the fallback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch

from radixlm.config import ATTENTION_BACKENDS

logger = logging.getLogger(__name__)


@cache
def extension_error() -> str | None:
    """None when the extension imports (its ops are then registered, each with a fake kernel, so `torch.compile`
    treats them as opaque), else why it does not."""
    try:
        import radixlm._C  # noqa: F401  (importing registers torch.ops.radixlm.*)
    except ImportError as error:
        return str(error)
    torch.library.register_fake("radixlm::paged_decode_attention")(_fake_decode_attention)
    torch.library.register_fake("radixlm::write_kv")(_fake_no_result)
    torch.library.register_fake("radixlm::rms_norm")(_fake_rms_norm)
    torch.library.register_fake("radixlm::rotary")(_fake_rotary)
    torch.library.register_fake("radixlm::small_batch_linear")(_fake_linear)
    torch.library.register_fake("radixlm::small_batch_int8_linear")(_fake_linear)
    torch.library.register_fake("radixlm::int8_normalize_rows")(_fake_normalize_rows)
    torch.library.register_fake("radixlm::int8_rescale_rows_")(_fake_no_result)
    return None


def direct_kernel(name: str) -> Callable[..., torch.Tensor]:
    """The extension's direct entry point `name` (csrc/python_module.cpp: "small_batch_linear",
    "small_batch_int8_linear", "int8_normalize_rows", "int8_rescale_rows_", "rms_norm", "rotary": the arguments and
    result of `torch.ops.radixlm.<name>`, without the dispatcher; "decode_attention", see `decode_layer`). Needs the
    extension (see `extension_error`)."""
    import radixlm._C

    return getattr(radixlm._C, name)


def _fake_decode_attention(query: torch.Tensor, *args: object) -> torch.Tensor:
    return query.new_empty(query.shape)


def _fake_no_result(*args: object) -> None:
    return None


def _fake_rms_norm(x: torch.Tensor, *args: object) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_linear(x: torch.Tensor, weight: torch.Tensor, *args: object) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _fake_normalize_rows(x: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0] + 1, x.shape[1])


def _fake_rotary(query_key: torch.Tensor, *args: object) -> torch.Tensor:
    batch, heads, tokens, head_dim = query_key.shape
    return query_key.new_empty(batch, tokens, heads, head_dim).permute(0, 2, 1, 3)


def write_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor, keys: torch.Tensor,
             values: torch.Tensor) -> None:
    """`key_cache[slot_mapping[t]] = keys[t]` and likewise for the values (`[T, Hkv, D]` rows, any strides), in the
    caches' dtype. On CPU with the extension one C++ call does both (index_copy_ paid about 6-30 us of set-up per
    call, twice per layer); elsewhere `index_copy_`, the reference, does it."""
    if key_cache.device.type == "cpu" and kernel_takes_rows(keys, values) and extension_error() is None:
        torch.ops.radixlm.write_kv(key_cache, value_cache, slot_mapping, keys, values)
        return
    key_cache.index_copy_(0, slot_mapping, keys.to(key_cache.dtype))
    value_cache.index_copy_(0, slot_mapping, values.to(value_cache.dtype))


def decode_layer(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                 value_cache: torch.Tensor, tables: DecodeTables, slot_mapping: torch.Tensor, scale: float,
                 sliding_window: int | None, softcap: float | None) -> torch.Tensor | None:
    """One attention layer of a step in which every row decodes, in one C++ call from the tensors transformers passes:
    query `[1, Hq, T, D]` and the new key/value `[1, Hkv, T, D]` -> `[1, T, Hq, D]`, the new K/V written at
    `slot_mapping` first. It takes the direct entry point (`radixlm._C.decode_attention`: the op without the
    dispatcher, and the views taken in C++; about 7 us a layer less) for float32 CPU tensors without autograd; None
    otherwise, and the caller goes the general way."""
    if (query.dtype != torch.float32 or not kernel_takes_rows(key, value) or key_cache.device.type != "cpu"
            or torch.is_grad_enabled()):
        return None
    return _direct_decode_attention()(query, key, value, key_cache, value_cache, tables.block_table,
                                      tables.block_offsets, tables.context_lens, slot_mapping, tables.block_size,
                                      scale, sliding_window or 0, softcap or 0.0)


@cache
def _direct_decode_attention() -> Callable[..., torch.Tensor]:
    return direct_kernel("decode_attention")


def kernel_takes_rows(keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether the C++ ops (`write_kv`, and `paged_decode_attention`'s new rows) take these K/V rows as they are."""
    return all(rows.dtype == torch.float32 and rows.stride(-1) == 1 for rows in (keys, values))


def resolve_backend(requested: str) -> str:
    """"cpp" or "torch" for `--attention-backend`: auto takes cpp when the extension imports, else torch with a
    warning; an explicit "cpp" without the extension is a ValueError."""
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {requested!r}")
    if requested == "torch":
        return "torch"
    error = extension_error()
    if error is None:
        return "cpp"
    if requested == "cpp":
        raise ValueError(f"attention_backend 'cpp' needs the radixlm._C extension (scripts/install.sh): {error}")
    logger.warning("radixlm._C is not built (%s); using the torch attention path", error)
    return "torch"


# A step's new K/V: (slot_mapping `[T]` int64, keys `[T, Hkv, D]`, values `[T, Hkv, D]`), rows in query order.
NewRows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class DecodeTables:
    """Per-step inputs of the kernel, built once per step: request b's blocks are
    `block_table[block_offsets[b]:]`, its context `context_lens[b]` positions (all int32)."""

    block_table: torch.Tensor
    block_offsets: torch.Tensor
    context_lens: torch.Tensor
    block_size: int

    @classmethod
    def build(cls, block_tables: list[list[int]], context_lens: list[int], block_size: int) -> DecodeTables:
        """`block_tables[b]` must hold at least the blocks of `context_lens[b]` positions. Consecutive rows given
        the same table object with non-decreasing lengths (a decode verifying drafts: a row per position) share
        one copy of it, and the kernel reads their context once for all of them."""
        flat: list[int] = []
        offsets: list[int] = []
        previous: list[int] | None = None
        previous_len = 0
        for table, length in zip(block_tables, context_lens, strict=True):
            if table is previous and length >= previous_len:
                offsets.append(offsets[-1])
                flat.extend(table[-(-previous_len // block_size):-(-length // block_size)])
            else:
                offsets.append(len(flat))
                flat.extend(table[:-(-length // block_size)])
            previous, previous_len = table, length
        return cls(torch.tensor(flat, dtype=torch.int32), torch.tensor(offsets, dtype=torch.int32),
                   torch.tensor(context_lens, dtype=torch.int32), block_size)


def paged_decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           tables: DecodeTables, scale: float, sliding_window: int | None,
                           softcap: float | None, new_rows: NewRows | None = None) -> torch.Tensor:
    """query `[B, Hq, D]` (any float dtype) over caches `[num_slots, Hkv, D]` (float32 or bfloat16) -> `[B, Hq, D]`
    in the query's dtype. Request b attends its last `sliding_window` positions (all when None); logits are
    soft-capped as `tanh(x / softcap) * softcap` when softcap is set. Arithmetic is float32. With `new_rows`
    (one per query row, float32) the kernel first writes them into the caches, as `write_kv` would."""
    error = extension_error()  # cached: imports the extension on first use
    if error is not None:
        raise RuntimeError(f"radixlm._C is not built: {error}")
    slot_mapping, new_keys, new_values = new_rows if new_rows is not None else (None, None, None)
    out = torch.ops.radixlm.paged_decode_attention(
        query.float(), key_cache, value_cache, tables.block_table, tables.block_offsets, tables.context_lens,
        tables.block_size, scale, sliding_window or 0, softcap or 0.0, slot_mapping, new_keys, new_values)
    return out.to(query.dtype)
