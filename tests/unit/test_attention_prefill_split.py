"""bfloat16 forwards on the C++ backend split the step: decode rows on the kernel, prefill chunks on the prefill kernel
(or, on CPUs without it, through SDPA as the torch backend computes them, bit for bit), every new K/V written; float32
forwards keep the decode kernel for all."""

from __future__ import annotations

import pytest
import torch

from radixlm.core.step import ScheduledChunk
from radixlm.model.attention.torch_backend import TorchAttentionBackend
from radixlm.model.input_batch import InputBatch
from radixlm.model.kv_cache import PagedKVCache
from radixlm.model.ops import extension_error

pytestmark = pytest.mark.skipif(extension_error() is not None, reason="radixlm._C is not built")
HQ, HKV, D, BLOCK = 4, 2, 16, 4


def run(backend, dtype, chunks, tables, cache):
    torch.manual_seed(0)
    batch = InputBatch.build(chunks, tables, cache, attention=backend)
    num_rows = batch.input_ids.shape[1]
    q, k, v = (torch.randn(1, h, num_rows, D, dtype=dtype) for h in (HQ, HKV, HKV))
    with torch.inference_mode():
        return backend.forward(0, q, k, v, batch.attn_metadata, None, None, None)[0], batch.attn_metadata


def step(cache):
    """Two decodes over 9- and 14-token contexts, a prefill chunk after a 6-token prefix, a fresh 11-token prompt."""
    chunks = [ScheduledChunk("d1", [1], 8, [], 1), ScheduledChunk("d2", [2], 13, [], 1),
              ScheduledChunk("p1", list(range(5)), 6, [], 0), ScheduledChunk("p2", list(range(11)), 0, [], 1)]
    tables = {"d1": [0, 1, 2], "d2": [3, 4, 5, 6], "p1": [7, 8, 9], "p2": [10, 11, 12]}
    torch.manual_seed(1)
    for layer_cache in (*cache.key_caches, *cache.value_caches):
        layer_cache.copy_(torch.randn_like(layer_cache, dtype=torch.float32).to(layer_cache.dtype))
    return chunks, tables


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prefill_rows_follow_the_torch_backend_in_bf16_only(dtype):
    from radixlm.model.attention.cpp_backend import CppAttentionBackend
    from radixlm.model.attention.prefill_kernel import kernel_takes, prefill_kernel_available

    outputs, caches = {}, {}
    for backend in (CppAttentionBackend(), TorchAttentionBackend()):
        cache = PagedKVCache(1, 16, BLOCK, HKV, D, dtype)
        chunks, tables = step(cache)
        outputs[backend.name], metadata = run(backend, dtype, chunks, tables, cache)
        caches[backend.name] = (cache.key_caches[0].clone(), cache.value_caches[0].clone())
        if backend.name == "cpp":
            assert (metadata.split is not None) == (dtype == torch.bfloat16)
    prefill_rows = slice(2, 18)
    same_prefill = torch.equal(outputs["cpp"][prefill_rows], outputs["torch"][prefill_rows])
    # float32: the decode kernel, rounded its own way; bfloat16 on a CPU with the prefill kernel, at a head size it
    # takes: that kernel, whose softmax rounds its own way too (within the tolerance below); else SDPA, as the torch
    # backend.
    assert same_prefill == (dtype == torch.bfloat16 and not (prefill_kernel_available() and kernel_takes(D)))
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(outputs["cpp"].float(), outputs["torch"].float(), atol=tolerance, rtol=tolerance)
    assert all(torch.equal(a, b) for a, b in zip(caches["cpp"], caches["torch"], strict=True))  # K/V all written
