"""Clients nobody here wrote, unmodified, against `radixlm serve` on the default model: the openai SDK (chat,
completions, models, embeddings, responses), LangChain (`ChatOpenAI` with `with_structured_output` and
`bind_tools`, `OpenAIEmbeddings`) and litellm (chat, streaming, its context-window error)."""

from __future__ import annotations

import json
import math
import os

import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.slow

MODEL = "m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def server(default_tool_server):
    return default_tool_server


def test_openai_sdk_every_endpoint(server):
    client = server.client()
    assert client.models.retrieve(MODEL).id == MODEL
    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0)
    assert "Paris" in chat.choices[0].message.content
    completion = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4,
                                           temperature=0)
    assert completion.choices[0].text
    response = client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=12,
                                       temperature=0)
    assert "Paris" in response.output_text
    vectors = client.embeddings.create(model=MODEL, input=["Paris", "the capital of France"]).data
    assert len(vectors) == 2 and math.isclose(sum(v * v for v in vectors[0].embedding), 1.0, rel_tol=1e-4)


def test_langchain_chat_structured_output_tools_and_embeddings(server):
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    class Answer(BaseModel):
        reasoning: str
        answer: str

    llm = ChatOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", model=MODEL, temperature=0,
                     max_tokens=80, max_retries=0)
    structured = llm.with_structured_output(Answer, method="json_schema").invoke("What is the capital of France?")
    assert isinstance(structured, Answer)
    message = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert [call["name"] for call in message.tool_calls] == ["get_weather"]
    assert isinstance(message.tool_calls[0]["args"]["city"], str)
    embeddings = OpenAIEmbeddings(base_url=f"{server.base_url}/v1", api_key="unused", model=MODEL,
                                  check_embedding_ctx_length=False)
    documents = embeddings.embed_documents(["Paris", "Oslo"])
    assert len(documents) == 2 and len(embeddings.embed_query("Paris")) == len(documents[0])


def test_litellm_chat_stream_and_context_window_error(server):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of its price list at import
    import litellm

    fields = dict(model=f"openai/{MODEL}", api_base=f"{server.base_url}/v1", api_key="unused", messages=QUESTION,
                  temperature=0)
    reply = litellm.completion(max_tokens=12, **fields)
    assert "Paris" in reply.choices[0].message.content
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in litellm.completion(
        max_tokens=12, stream=True, **fields))
    assert streamed == reply.choices[0].message.content
    # The refusal's wording is what litellm matches to raise its ContextWindowExceededError (and fall back).
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(max_tokens=10**6, num_retries=0, **fields)
    forced = litellm.completion(max_tokens=40, tools=[WEATHER], tool_choice="required", **fields)
    call = forced.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)


def test_required_tool_choice_ends_after_the_call(server):
    """The newline the model writes after `</tool_call>` used to force another call, often until max_tokens (the
    SDK's parse() then raised LengthFinishReasonError and agents ran the tool twice)."""
    client = server.client()
    for question in ("What is the weather in Paris?", "Is it raining in Oslo?", "Weather for Lima, please"):
        completion = client.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": question}], tool_choice="required",
            tools=[{"type": "function", "function": WEATHER["function"] | {"strict": True} | {"parameters": {
                **WEATHER["function"]["parameters"], "additionalProperties": False}}}],
            max_tokens=120, temperature=0)
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert len(choice.message.tool_calls) == 1, choice.message.tool_calls
