"""Writing a step's new K/V into the paged caches, shared by the attention backends."""

from __future__ import annotations

import torch

from radixlm.model.kv_cache import LayerCache
from radixlm.model.kv_int8 import quantize_rows
from radixlm.model.ops import extension_error

KERNEL_ROW_DTYPES = (torch.float32, torch.bfloat16)


def kernel_takes_rows(keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether the C++ ops (`write_kv`, and `paged_decode_attention`'s new rows) take these K/V rows as they are:
    float32 or bfloat16, both the same, the last dimension contiguous."""
    return (keys.dtype in KERNEL_ROW_DTYPES and values.dtype == keys.dtype
            and keys.stride(-1) == 1 and values.stride(-1) == 1)


def write_kv(layer: LayerCache, slot_mapping: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    """`layer.keys[slot_mapping[t]] = keys[t]` and likewise for the values (`[T, Hkv, D]` rows, any strides), in the
    caches' dtype (int8 caches: quantized, their scales written too). On CPU with the extension one C++ call does
    both (index_copy_ paid about 6-30 us of set-up per call, twice per layer); elsewhere `index_copy_`, the
    reference, does it."""
    if layer.keys.device.type == "cpu" and kernel_takes_rows(keys, values) and extension_error() is None:
        torch.ops.radixlm.write_kv(layer.keys, layer.values, slot_mapping, keys, values, layer.key_scales,
                                   layer.value_scales)
        return
    if layer.key_scales is None or layer.value_scales is None:
        layer.keys.index_copy_(0, slot_mapping, keys.to(layer.keys.dtype))
        layer.values.index_copy_(0, slot_mapping, values.to(layer.values.dtype))
        return
    for cache, scales, rows in ((layer.keys, layer.key_scales, keys), (layer.values, layer.value_scales, values)):
        quantized, row_scales = quantize_rows(rows)
        cache.index_copy_(0, slot_mapping, quantized)
        scales.index_copy_(0, slot_mapping, row_scales)
