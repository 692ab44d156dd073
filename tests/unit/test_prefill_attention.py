"""The AVX-512 BF16 prefill kernel (`torch.ops.radixlm.prefill_attention`), on the dot product and on AMX tiles,
against float32 attention on the same bfloat16 inputs: causal over a cached prefix, grouped heads, sliding windows,
soft-caps, strided views, odd sizes; and `attend_prefill_chunk` through either path gives SDPA's rows."""

import math

import pytest
import torch

from radixlm.model.attention.prefill_kernel import attend_prefill_chunk, kernel_takes, prefill_tiles_available
from radixlm.model.attention.torch_backend import PrefillSegment
from radixlm.model.kv_cache import PagedKVCache
from radixlm.model.ops import direct_kernel, extension_error

pytestmark = pytest.mark.skipif(
    extension_error() is not None or not direct_kernel("avx512_bf16_available")(),
    reason="needs radixlm._C on a CPU with AVX-512 BF16")


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int,
              softcap: float) -> torch.Tensor:
    """float32 attention: q `[T, Hq, D]` at the last T positions of k, v `[L, Hkv, D]` -> `[T, Hq, D]`."""
    (num_queries, num_heads, _), num_keys = q.shape, k.shape[0]
    rep = num_heads // k.shape[1]
    qf, kf, vf = (t.float().transpose(0, 1) for t in (q, k, v))
    kf, vf = kf.repeat_interleave(rep, 0), vf.repeat_interleave(rep, 0)
    logits = qf @ kf.transpose(1, 2) * scale
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    position = torch.arange(num_keys - num_queries, num_keys)[:, None]
    key = torch.arange(num_keys)[None, :]
    allowed = key <= position
    if window:
        allowed &= key > position - window
    weights = torch.softmax(logits.masked_fill(~allowed, -math.inf), dim=-1)
    return (weights @ vf).transpose(0, 1)


TILES = [False, pytest.param(True, marks=pytest.mark.skipif(not prefill_tiles_available(),
                                                            reason="needs a CPU with AMX-BF16"))]


def run_kernel(q, k, v, scale, window=0, softcap=0.0, tiles=False):
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
    torch.ops.radixlm.prefill_attention(q, k, v, out, scale, window, softcap, tiles)
    return out


CASES = [  # queries, keys, query heads, KV heads, head size, window, softcap
    (1, 1, 1, 1, 64, 0, 0.0),
    (7, 7, 9, 3, 64, 0, 0.0),
    (37, 100, 9, 3, 64, 0, 0.0),
    (256, 256, 4, 1, 128, 0, 0.0),
    (65, 300, 8, 2, 64, 50, 0.0),
    (20, 20, 4, 4, 80, 0, 30.0),
    (33, 70, 14, 2, 16, 0, 0.0),
    (3, 200, 130, 1, 64, 17, 0.0),
    (90, 150, 4, 2, 96, 0, 0.0),
    (40, 40, 2, 1, 32, 0, 0.0),
    (100, 300, 6, 2, 64, 0, 20.0),
    (64, 130, 6, 3, 128, 40, 10.0),
]


@pytest.mark.parametrize("tiles", TILES, ids=["dot", "tiles"])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_kernel_matches_float32_attention(case, tiles: bool) -> None:
    num_queries, num_keys, num_heads, num_kv_heads, head_dim, window, softcap = case
    if tiles and head_dim % 32:
        pytest.skip("the tiles take head sizes that are multiples of 32")
    generator = torch.Generator().manual_seed(num_queries * 1000 + num_keys)
    q = torch.randn(num_queries, num_heads, head_dim, generator=generator).to(torch.bfloat16)
    k = torch.randn(num_keys, num_kv_heads, head_dim, generator=generator).to(torch.bfloat16)
    v = torch.randn(num_keys, num_kv_heads, head_dim, generator=generator).to(torch.bfloat16)
    scale = head_dim ** -0.5 * 2  # sharper than usual, so that masking mistakes show
    expected = reference(q, k, v, scale, window, softcap)
    got = run_kernel(q, k, v, scale, window, softcap, tiles).float()
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("tiles", TILES, ids=["dot", "tiles"])
def test_strided_views_and_huge_logits(tiles: bool) -> None:
    """Query heads-major views (as transformers lays them out) and K/V that are slices of a cache; logits in the
    thousands stay finite (the running max is subtracted before exp)."""
    generator = torch.Generator().manual_seed(5)
    queries = (torch.randn(6, 50, 64, generator=generator) * 30).to(torch.bfloat16)  # [Hq, T, D]
    cache = (torch.randn(400, 2, 64, generator=generator) * 30).to(torch.bfloat16)
    q, k, v = queries.transpose(0, 1), cache[100:180], cache[200:280]
    got = run_kernel(q, k, v, 1.0, tiles=tiles).float()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, reference(q, k, v, 1.0, 0, 0.0), atol=0.5, rtol=2e-2)


@pytest.mark.parametrize("tiles", TILES, ids=["dot", "tiles"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_scores_that_climb_or_fall_along_the_keys(tiles: bool, head_dim: int, direction: float) -> None:
    """Logits that rise along the keys raise each row's running max over and over (the output rescaled each time it
    passes the old max by the kernel's slack), and falling ones leave it at the first key with later probabilities
    near zero: 300 keys, logits spanning about 60, every row against float32."""
    generator = torch.Generator().manual_seed(head_dim)
    num_keys, num_queries = 300, 120
    ramp = torch.linspace(0, direction * 60, num_keys)[:, None, None]
    q = torch.ones(num_queries, 6, head_dim).to(torch.bfloat16)
    k = (ramp / head_dim + 0.05 * torch.randn(num_keys, 2, head_dim, generator=generator)).to(torch.bfloat16)
    v = torch.randn(num_keys, 2, head_dim, generator=generator).to(torch.bfloat16)
    got = run_kernel(q, k, v, 1.0, tiles=tiles).float()
    torch.testing.assert_close(got, reference(q, k, v, 1.0, 0, 0.0), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("tiles", TILES, ids=["dot", "tiles"])
def test_a_nan_key_poisons_only_the_rows_that_see_it(tiles: bool) -> None:
    """Key 150 NaN: the rows at positions before it equal float32 attention, every row from it on is NaN."""
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(200, 6, 64, generator=generator).to(torch.bfloat16)
    k, v = (torch.randn(200, 2, 64, generator=generator).to(torch.bfloat16) for _ in "kv")
    k[150, 1, 7] = math.nan
    got = run_kernel(q, k, v, 0.125, tiles=tiles).float()
    torch.testing.assert_close(got[:150], reference(q[:150], k[:150], v[:150], 0.125, 0, 0.0), atol=2e-2, rtol=2e-2)
    assert got[150:, 3:].isnan().all() and not got[150:, :3].isnan().any()


@pytest.mark.parametrize("bad", ["dtype", "short context", "head size", "heads", "nan scale", "shape", "tiles"])
def test_bad_arguments_are_errors(bad: str) -> None:
    q = torch.zeros(4, 4, 64, dtype=torch.bfloat16)
    k = v = torch.zeros(8, 2, 64, dtype=torch.bfloat16)
    out, scale, tiles = torch.empty_like(q), 1.0, False
    if bad == "dtype":
        q = q.float()
    elif bad == "short context":
        k = v = k[:3]
    elif bad == "head size":
        q, k, v, out = (t[..., :24] for t in (q, k, v, out))
    elif bad == "heads":
        k = v = torch.zeros(8, 3, 64, dtype=torch.bfloat16)
    elif bad == "nan scale":
        scale = math.nan
    elif bad == "tiles":  # a head size the tiles do not take, or a CPU without them
        q, k, v, out = (t[..., :48] for t in (q, k, v, out))
        tiles = True
    else:
        out = out[:2]
    with pytest.raises(RuntimeError):
        torch.ops.radixlm.prefill_attention(q, k, v, out, scale, 0, 0.0, tiles)


@pytest.mark.parametrize("head_dim", [64, 48])
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("output_dtype", [torch.bfloat16, torch.float32])
def test_attend_prefill_chunk_kernel_and_sdpa_agree(cached: bool, output_dtype: torch.dtype, head_dim: int) -> None:
    """A chunk of 24 rows after 8 other rows of the batch, its context either fresh or 40 cached positions; a head
    size the kernel does not take here (48 where the tiles run) goes to SDPA, whose rows it then equals exactly."""
    generator = torch.Generator().manual_seed(11)
    cache = PagedKVCache(1, 16, 4, 2, head_dim, torch.bfloat16)
    layer = cache.layer(0)
    layer.keys.copy_(torch.randn(layer.keys.shape, generator=generator))
    layer.values.copy_(torch.randn(layer.values.shape, generator=generator))
    total_rows, start, num_queries = 40, 8, 24
    queries = torch.randn(6, total_rows, head_dim, generator=generator).to(torch.bfloat16)
    new_keys, new_values = (torch.randn(total_rows, 2, head_dim, generator=generator).to(torch.bfloat16)
                            for _ in "kv")
    context = slice(3, 43) if cached else None
    segment = PrefillSegment(start=start, num_queries=num_queries, context_slots=context,
                             context_len=40 if cached else num_queries)
    outputs = []
    for use_kernel in (False, True):
        output = torch.zeros(total_rows, 6, head_dim, dtype=output_dtype)
        attend_prefill_chunk(queries, new_keys, new_values, layer, segment, output, 0.125, None, None, use_kernel)
        outputs.append(output)
    assert outputs[1][:start].eq(0).all() and outputs[1][start + num_queries:].eq(0).all()
    torch.testing.assert_close(outputs[1].float(), outputs[0].float(), atol=2e-2, rtol=2e-2)
    assert kernel_takes(head_dim) == (head_dim % 32 == 0 or not prefill_tiles_available())
    if not kernel_takes(head_dim):
        assert torch.equal(outputs[1], outputs[0])
