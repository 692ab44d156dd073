"""`radixlm bench soak` on the tiny model: a short run passes (the full 1,000-request run is in the closing note)."""

from radixlm.bench.soak import bench_soak
from radixlm.bench.soak_requests import MALFORMED, build_requests


def test_the_mix_holds_every_kind_of_request():
    requests = build_requests(1000, seed=0)
    malformed = [r for r in requests if r.malformed]
    assert 30 <= len(malformed) <= 70 and {r.body for r in malformed} == set(MALFORMED)
    assert 150 <= sum(r.disconnect_after is not None for r in requests) <= 250
    bodies = [r.body for r in requests if not r.malformed]
    for marker in ('"n":', '"response_format"', '"stop":', '"logprobs"', '"seed"', '"stream": true'):
        assert any(marker in body for body in bodies), marker


def test_a_short_soak_passes(tiny_model_dir, capsys):
    options = {"model": str(tiny_model_dir("llama")), "num_kv_blocks": 256, "block_size": 4, "num_threads": 1}
    passed = bench_soak(None, options, num_requests=300, concurrency=16, seed=0)
    out = capsys.readouterr().out
    assert passed, out
    assert "crashes: 0; leaked blocks: 0; running/waiting at the end: 0/0" in out


def test_a_short_soak_with_adapters_churning_passes(tiny_model_dir, capsys):
    """`--lora`: a fifth of the requests on two adapters while a third is loaded, used and unloaded."""
    options = {"model": str(tiny_model_dir("llama")), "num_kv_blocks": 256, "block_size": 4, "num_threads": 1}
    passed = bench_soak(None, options, num_requests=150, concurrency=16, seed=0, lora=True)
    out = capsys.readouterr().out
    assert passed, out
    assert "unloads refused while in use" in out and "PASS (with --lora)" in out
