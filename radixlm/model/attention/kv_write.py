"""Writing a step's new K/V into the paged caches, shared by the attention backends."""

from __future__ import annotations

import torch

from radixlm.model.ops import extension_error


def kernel_takes_rows(keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether the C++ ops (`write_kv`, and `paged_decode_attention`'s new rows) take these K/V rows as they are."""
    return all(rows.dtype == torch.float32 and rows.stride(-1) == 1 for rows in (keys, values))


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
