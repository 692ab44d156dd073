"""LoRA adapters over HTTP: --lora-modules at start, /v1/models with `parent`, `model` selecting an adapter (greedy
equal to PEFT's), load and unload at run time (vLLM's shapes, behind the API key), bad adapters and refused changes
as 400s naming the field, and requests counted per adapter in /metrics."""

from __future__ import annotations

import json

import pytest
from lora_adapters import build_adapter, peft_greedy
from transformers import AutoTokenizer

from server.inprocess import InProcessServer

PROMPT = [5, 17, 40, 3, 23, 31, 7, 9]
KEY = "sk-lora"


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    base = tiny_model_dir("llama")
    root = tmp_path_factory.mktemp("lora-server")
    return {"a1": build_adapter(base, root / "a1", seed=1), "a2": build_adapter(base, root / "a2", seed=2, rank=8)}


@pytest.fixture(scope="module")
def server(tiny_model_dir, adapters):
    server = InProcessServer(tiny_model_dir("llama"), {"num_kv_blocks": 256, "block_size": 4,
                                                        "lora_modules": [f"a1={adapters['a1']}"], "max_loras": 2},
                             api_key=KEY)
    yield server
    server.stop()


def completion(server, model):
    reply = server.http.post("/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 8,
                                                      "temperature": 0, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_models_list_adapters_with_their_parent(server, tiny_model_dir):
    cards = server.http.get("/v1/models").json()["data"]
    base = str(tiny_model_dir("llama"))
    assert [(c["id"], c.get("parent")) for c in cards] == [(base, None), ("a1", base)]
    assert server.http.get("/v1/models/a1").json()["parent"] == base


def test_model_selects_the_adapter_and_matches_peft(server, tiny_model_dir, adapters):
    base = tiny_model_dir("llama")
    tokenizer = AutoTokenizer.from_pretrained(base)
    for model, adapter in (("a1", adapters["a1"]), (str(base), None)):
        expected = tokenizer.decode(peft_greedy(base, adapter, [PROMPT], 8)[0])
        assert completion(server, model)["choices"][0]["text"] == expected, model
    assert completion(server, "a1")["choices"][0]["text"] != completion(server, str(base))["choices"][0]["text"]
    missing = server.http.post("/v1/completions", json={"model": "nope", "prompt": PROMPT, "max_tokens": 2})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"


def test_load_use_and_unload_at_run_time(server, adapters):
    reply = server.http.post("/v1/load_lora_adapter", json={"lora_name": "a2", "lora_path": str(adapters["a2"])})
    assert reply.status_code == 200 and "a2" in reply.text
    answer = completion(server, "a2")
    assert answer["choices"][0]["text"] and answer["model"] == "a2"  # the adapter's name, as vLLM answers
    assert "a2" in [c["id"] for c in server.http.get("/v1/models").json()["data"]]
    metrics = server.http.get("/metrics").text
    assert 'radixlm:lora_requests_total{' in metrics and 'lora_name="a2"' in metrics
    full = server.http.post("/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": str(adapters["a2"])})
    assert full.status_code == 400 and "--max-loras" in full.json()["error"]["message"]
    again = server.http.post("/v1/load_lora_adapter", json={"lora_name": "a2", "lora_path": str(adapters["a2"])})
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    assert server.http.post("/v1/unload_lora_adapter", json={"lora_name": "a2"}).status_code == 200
    gone = server.http.post("/v1/completions", json={"model": "a2", "prompt": PROMPT, "max_tokens": 2})
    assert gone.status_code == 404
    assert 'lora_name="a2"' not in server.http.get("/metrics").text
    unknown = server.http.post("/v1/unload_lora_adapter", json={"lora_name": "a2"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "lora_name"


def test_bad_adapters_are_400s_naming_the_field(server, adapters, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    config = json.loads((adapters["a2"] / "adapter_config.json").read_text())
    (broken / "adapter_config.json").write_text(json.dumps({**config, "r": 4096}))
    (broken / "adapter_model.safetensors").write_bytes((adapters["a2"] / "adapter_model.safetensors").read_bytes())
    cases = [({"lora_name": "b", "lora_path": str(broken)}, "r"),
             ({"lora_name": "b", "lora_path": str(tmp_path / "nowhere")}, "lora_path"),
             ({"lora_name": "", "lora_path": "x"}, "lora_name"),
             ({"lora_name": "b"}, "lora_path")]
    for body, field in cases:
        reply = server.http.post("/v1/load_lora_adapter", json=body)
        assert reply.status_code == 400, (body, reply.text)
        assert reply.json()["error"]["param"] == field, (body, reply.json())
    assert completion(server, "a1")["choices"][0]["text"]  # still serving


def test_changes_need_the_api_key(server, adapters):
    plain = server.http_client(with_key=False)
    reply = plain.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(adapters["a2"])})
    assert reply.status_code == 401
