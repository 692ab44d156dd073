"""The disk tier (`--kv-offload-dir`) on a real (tiny) model: block files checked on every read (a truncated,
corrupt or foreign file is ignored and its tokens recomputed, a failed write costs nothing), and prefixes saved at a
clean shutdown serving the first request after a restart with the tokens recomputing gives."""

import errno
import os

import pytest
import torch

from radixlm.engine.llm_engine import LLMEngine, build_engine
from radixlm.model.disk_kv_store import DiskKVStore
from radixlm.model.kv_cache import PagedKVCache
from radixlm.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
KEY = bytes(range(16))


def _store(directory, identity=b"model", dtype=torch.bfloat16, head_dim=8) -> tuple[DiskKVStore, PagedKVCache]:
    cache = PagedKVCache(2, 4, 4, 2, head_dim, dtype)
    return DiskKVStore(directory, identity, cache.tensors(), 4), cache


def _block(cache: PagedKVCache, block: int) -> list[torch.Tensor]:
    return [t[block * 4:(block + 1) * 4] for t in cache.tensors()]


def test_a_block_file_reads_back_exactly_and_a_bad_one_is_ignored_and_deleted(tmp_path):
    store, cache = _store(tmp_path)
    for tensor in cache.tensors():
        tensor.copy_(torch.randn(tensor.shape))
    assert store.write(KEY, _block(cache, 1))
    assert store.read(KEY, _block(cache, 3))
    assert all(torch.equal(a, b) for a, b in zip(_block(cache, 1), _block(cache, 3), strict=True))
    good = store.path(KEY).read_bytes()
    other, _ = _store(tmp_path, identity=b"another model")
    layout, _ = _store(tmp_path, head_dim=16)
    damaged = {"truncated": good[:len(good) // 2], "corrupt": good[:100] + bytes([good[100] ^ 1]) + good[101:],
               "empty": b"", "not ours": b"hello" * 100}
    for name, data in damaged.items():
        store.path(KEY).write_bytes(data)
        assert not store.read(KEY, _block(cache, 2)), name
        assert not store.path(KEY).exists(), f"{name}: a bad file is deleted"
    for reader in (other, layout):  # a well-formed file written for another model or layout
        store.path(KEY).write_bytes(good)
        assert not reader.read(KEY, _block(cache, 2))
    assert not store.read(KEY, _block(cache, 2))  # missing


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    store, cache = _store(tmp_path)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    assert not store.write(KEY, _block(cache, 0))
    assert list(tmp_path.iterdir()) == []


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    prefixes = [torch.randint(3, 300, (40,), generator=generator).tolist() for _ in range(4)]
    return [prefix + [9, 11 + index] for index, prefix in enumerate(prefixes)]


def _generate(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    outputs = []
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, PARAMS)
        while engine.has_unfinished_requests():
            for output in engine.step():
                tokens = output.outputs[0].token_ids
            engine.check_invariants()
        outputs.append(tokens)
    return outputs


def _engine(model: str, directory, **options) -> LLMEngine:
    return build_engine(model=model, num_kv_blocks=20, block_size=4, kv_offload_memory="64KiB",
                        kv_offload_dir=str(directory), **options)


@pytest.mark.parametrize("damage", [None, "corrupt", "truncate"])
def test_prefixes_saved_at_shutdown_serve_the_restarted_engine(tiny_model_dir, tmp_path, damage):
    model = str(tiny_model_dir("llama"))
    expected = _generate(build_engine(model=model, num_kv_blocks=20, block_size=4), _prompts())
    first = _engine(model, tmp_path)
    assert _generate(first, _prompts()) == expected
    first.close()
    files = sorted(tmp_path.rglob("*.kv"))
    assert files, "the shutdown saved nothing"
    for path in files if damage else []:
        data = path.read_bytes()
        path.write_bytes(data[:-7] if damage == "truncate" else data[:50] + bytes([data[50] ^ 0xFF]) + data[51:])
    restarted = _engine(model, tmp_path)
    assert _generate(restarted, _prompts()) == expected
    stats = restarted.scheduler.kv_cache_manager.offload.stats
    if damage:
        assert stats.num_disk_failed_blocks > 0 and stats.num_hit_tokens == 0
    else:
        assert stats.num_disk_read_blocks > 0 and stats.num_hit_tokens >= 40 and stats.num_disk_failed_blocks == 0
    other = _engine(str(tiny_model_dir("qwen2")), tmp_path)  # another model: its own directory, no file of ours
    assert len(other.scheduler.kv_cache_manager.offload.disk) == 0


def test_the_model_identity_changes_with_the_weights_and_the_settings(tmp_path):
    from radixlm.cache_config import CacheConfig
    from radixlm.config import ModelConfig
    from radixlm.model.model_identity import model_identity

    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    weights = bytearray(torch.randint(0, 256, (5 << 20,), dtype=torch.uint8).numpy().tobytes())
    (tmp_path / "model.safetensors").write_bytes(weights)
    model, cache = ModelConfig(model=str(tmp_path)), CacheConfig()
    identity = model_identity(tmp_path, model, cache)
    assert model_identity(tmp_path, model, cache) == identity
    assert model_identity(tmp_path, model, CacheConfig(kv_cache_dtype="int8")) != identity
    assert model_identity(tmp_path, ModelConfig(model=str(tmp_path), dtype="bfloat16"), cache) != identity
    for offset in (10, len(weights) // 2, len(weights) - 10):  # the head, an evenly spaced piece, the tail
        changed = bytearray(weights)
        changed[offset] ^= 1
        (tmp_path / "model.safetensors").write_bytes(changed)
        assert model_identity(tmp_path, model, cache) != identity, offset
