"""The worker's torch bitmask stage against xgrammar's own (the reference): same -inf cells, other rows untouched."""

import pytest
import torch

from radixlm.sample.bitmask import apply_token_bitmask_

xgr = pytest.importorskip("xgrammar")


@pytest.mark.parametrize("vocab_size", [32, 100, 49152])
def test_the_torch_bitmask_stage_matches_xgrammar(vocab_size):
    generator = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(5, vocab_size, generator=generator)
    bitmask = xgr.allocate_token_bitmask(2, vocab_size)
    bitmask.copy_(torch.randint(-2**31, 2**31 - 1, bitmask.shape, generator=generator, dtype=torch.int64).int())
    rows = [3, 1]
    expected = logits.clone()
    full = xgr.allocate_token_bitmask(5, vocab_size)
    full[rows] = bitmask
    xgr.apply_token_bitmask_inplace(expected, full, indices=rows)
    ours = logits.clone()
    apply_token_bitmask_(ours, rows, bitmask)
    assert torch.equal(ours, expected)
    assert torch.equal(ours[[0, 2, 4]], logits[[0, 2, 4]])
