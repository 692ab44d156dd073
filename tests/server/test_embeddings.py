"""POST /v1/embeddings through the official openai client (float, and the base64 it asks for by default), raw
HTTP and LangChain's OpenAIEmbeddings, on the tiny random-weight Llama: vectors equal HF's, every limit is a 400 in
OpenAI's shape, and embeddings running beside completions leave the completions' greedy text as it was."""

from __future__ import annotations

import asyncio
import base64
import struct

import openai
import pytest
import torch
from e2e.hf_reference import hf_embeddings

from radixlm.server.embeddings import encode_vector
from server.inprocess import InProcessServer, ThreadedServer

HIDDEN_SIZE = 64  # the tiny models'
MAX_MODEL_LEN = 512  # their max_position_embeddings
TEXTS = ["the quick brown fox", "radix trees share common prefixes", "a paged KV cache"]


def close(a: list[float], b: list[float], tolerance: float = 1e-5) -> bool:
    return len(a) == len(b) and (torch.tensor(a) - torch.tensor(b)).abs().max().item() < tolerance


def post(server, body: dict) -> dict:
    response = server.http.post("/v1/embeddings", json=body)
    return {"status": response.status_code, **response.json()}


def tokenize(server, text: str) -> list[int]:
    return server.http.post("/tokenize", json={"prompt": text}).json()["tokens"]


def test_float_and_base64_agree_and_equal_hf(client, model, tiny_server, tiny_model_dir):
    floats = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    decoded = client.embeddings.create(model=model, input=TEXTS)  # the SDK asks for base64 and decodes it
    assert floats.object == "list" and floats.model == model
    assert [d.index for d in floats.data] == [0, 1, 2] and all(d.object == "embedding" for d in floats.data)
    # (the second request hits the prefix cache and computes only its last token: equal up to float rounding)
    assert all(close(a.embedding, b.embedding, 1e-6) for a, b in zip(decoded.data, floats.data, strict=True))
    token_ids = [tokenize(tiny_server, text) for text in TEXTS]
    expected = hf_embeddings(tiny_model_dir("llama"), token_ids, "last")  # the server's default --pooling
    assert all(close(d.embedding, e) for d, e in zip(floats.data, expected, strict=True))
    num_tokens = sum(map(len, token_ids))
    assert (floats.usage.prompt_tokens, floats.usage.total_tokens) == (num_tokens, num_tokens)


def test_base64_is_little_endian_float32(tiny_server, model):
    floats = post(tiny_server, {"model": model, "input": TEXTS[0]})
    raw = post(tiny_server, {"model": model, "input": TEXTS[0], "encoding_format": "base64"})
    data = base64.b64decode(raw["data"][0]["embedding"])
    assert len(data) == 4 * HIDDEN_SIZE
    assert close(list(struct.unpack(f"<{HIDDEN_SIZE}f", data)), floats["data"][0]["embedding"], 1e-6)
    vector = floats["data"][0]["embedding"]
    assert struct.unpack(f"<{HIDDEN_SIZE}f", base64.b64decode(encode_vector(vector, "base64"))) == tuple(vector)
    assert set(floats) == {"status", "object", "data", "model", "usage"}
    assert floats["usage"] == {"prompt_tokens": len(tokenize(tiny_server, TEXTS[0])),
                               "total_tokens": len(tokenize(tiny_server, TEXTS[0]))}


def test_a_list_of_texts_equals_each_text_alone(client, model):
    together = [d.embedding for d in client.embeddings.create(model=model, input=TEXTS).data]
    alone = [client.embeddings.create(model=model, input=text).data[0].embedding for text in TEXTS]
    assert all(close(a, b) for a, b in zip(together, alone, strict=True))
    assert not close(together[0], together[1])


def test_token_ids_and_lists_of_them(client, model, tiny_model_dir):
    prompts = [[5, 6, 7, 8], [100, 101], list(range(3, 300))]
    expected = hf_embeddings(tiny_model_dir("llama"), prompts, "last")
    one = client.embeddings.create(model=model, input=prompts[0]).data
    many = client.embeddings.create(model=model, input=prompts).data
    assert len(one) == 1 and close(one[0].embedding, expected[0])
    assert all(close(d.embedding, e) for d, e in zip(many, expected, strict=True))
    full = client.embeddings.create(model=model, input=[7] * MAX_MODEL_LEN).data  # a prompt may fill the context
    assert len(full[0].embedding) == HIDDEN_SIZE


def test_dimensions_other_than_the_hidden_size_are_refused(client, model):
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=model, input="hi", dimensions=32)
    assert error.value.body["param"] == "dimensions" and f"{HIDDEN_SIZE} dimensions" in error.value.body["message"]
    assert len(client.embeddings.create(model=model, input="hi", dimensions=HIDDEN_SIZE).data[0].embedding) == 64


@pytest.mark.parametrize("value", ["", [], [""], [[]], ["fine", ""]])
def test_empty_inputs_are_refused(tiny_server, model, value):
    answer = post(tiny_server, {"model": model, "input": value})
    assert answer["status"] == 400 and answer["error"]["param"] == "input", answer


def test_too_many_inputs_are_refused_before_tokenizing(tiny_server, model):
    answer = post(tiny_server, {"model": model, "input": ["x"] * 65})
    assert answer["status"] == 400 and answer["error"]["param"] == "input"
    assert "--max-prompts-per-request" in answer["error"]["message"]


def test_inputs_longer_than_the_context_are_refused(client, model, tiny_server):
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=model, input=[7] * (MAX_MODEL_LEN + 1))
    body = error.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "input"
    assert body["message"].startswith(f"This model's maximum context length is {MAX_MODEL_LEN} tokens")
    long_text = post(tiny_server, {"model": model, "input": ["ok", "fox " * 100_000]})
    assert long_text["status"] == 400 and long_text["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("body, param", [
    ({"input": [384]}, "input"), ({"input": [[1], [-1]]}, "input"), ({"input": [1, "a"]}, "input"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "hi", "dimensions": "64"}, "dimensions"),
    ({"input": "hi", "priority": 3}, "priority"), ({}, "input")])
def test_bad_values_are_400s_naming_the_field(tiny_server, model, body, param):
    answer = post(tiny_server, {"model": model, **body})
    assert answer["status"] == 400 and answer["error"]["param"] == param, answer


def test_an_unknown_model_is_404(tiny_server):
    answer = post(tiny_server, {"model": "nope", "input": "hi"})
    assert answer["status"] == 404 and answer["error"]["code"] == "model_not_found"


def test_embeddings_beside_completions_leave_the_greedy_text_unchanged(tiny_server, model):
    prompt = "the quick brown fox"
    alone = tiny_server.client().completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)

    async def together() -> tuple[str, list]:
        async with tiny_server.async_client() as client:
            completion, *embeddings = await asyncio.gather(
                client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0),
                *[client.embeddings.create(model=model, input=[f"{text} {i}" for text in TEXTS]) for i in range(4)])
        return completion.choices[0].text, embeddings

    text, embeddings = asyncio.run(together())
    assert text == alone.choices[0].text and all(len(e.data) == 3 for e in embeddings)


@pytest.fixture(scope="module")
def mean_server(tiny_model_dir):
    """`radixlm serve --pooling mean` behind a real socket (LangChain needs a URL)."""
    server = ThreadedServer(tiny_model_dir("llama"), engine_options={"num_kv_blocks": 256, "block_size": 4,
                                                                     "pooling": "mean"})
    yield server
    server.stop()


def test_langchain_embeddings_on_a_mean_pooling_server(mean_server, tiny_model_dir):
    from langchain_openai import OpenAIEmbeddings

    model = str(tiny_model_dir("llama"))
    embeddings = OpenAIEmbeddings(base_url=f"{mean_server.base_url}/v1", api_key="unused", model=model,
                                  check_embedding_ctx_length=False)
    documents = embeddings.embed_documents(TEXTS)
    query = embeddings.embed_query(TEXTS[1])
    token_ids = [tokenize(mean_server, text) for text in TEXTS]
    expected = hf_embeddings(tiny_model_dir("llama"), token_ids, "mean")
    assert len(documents) == 3 and all(close(d, e) for d, e in zip(documents, expected, strict=True))
    assert close(query, expected[1])


def test_data_parallel_replicas_serve_embeddings(tiny_model_dir):
    server = InProcessServer(tiny_model_dir("llama"), {"num_kv_blocks": 256, "block_size": 4,
                                                       "data_parallel_size": 2})
    try:
        model = str(tiny_model_dir("llama"))
        prompts = [[5, 6, 7, 8], [100, 101], [9] * 40, [11, 12, 13]]
        data = server.client().embeddings.create(model=model, input=prompts).data
    finally:
        server.stop()
    expected = hf_embeddings(tiny_model_dir("llama"), prompts, "last")
    assert all(close(d.embedding, e) for d, e in zip(data, expected, strict=True))
