"""Structured outputs over HTTP: response_format json_object / json_schema, regex, ebnf, choice (and vLLM's
spellings), streaming and not, on both endpoints, through the official openai client."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9},
                                           "ok": {"type": "boolean"}}, "required": ["id", "ok"]}
MESSAGES = [{"role": "user", "content": "the quick brown fox"}]


def test_json_schema_and_json_object(client, model):
    response = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA, "strict": True}})
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    for seed in range(3):
        response = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=80, temperature=1.0,
                                                  seed=seed, response_format={"type": "json_object"})
        if response.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(response.choices[0].message.content), dict)


def test_json_schema_keys_come_in_the_schemas_order(client, model):
    """Chain-of-thought schemas put `reasoning` first on purpose; the keys used to come out sorted."""
    schema = {"type": "object", "properties": {"zeta": {"type": "string", "maxLength": 4},
                                               "alpha": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["zeta", "alpha"], "additionalProperties": False}
    num_checked = 0
    for seed in range(3):
        response = client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=60, temperature=1.0, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "cot", "schema": schema}})
        if response.choices[0].finish_reason == "stop":
            assert list(json.loads(response.choices[0].message.content, strict=False)) == ["zeta", "alpha"]
            num_checked += 1
    assert num_checked


@pytest.mark.parametrize("field", ["regex", "guided_regex"])
def test_regex_on_completions_stream_and_not(client, model, field):
    pattern = r"[a-c]{2,4}-\d{3}"
    kwargs = dict(model=model, prompt="radix", max_tokens=20, temperature=0, extra_body={field: pattern})
    text = client.completions.create(**kwargs).choices[0].text
    assert re.fullmatch(pattern, text)
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(stream=True, **kwargs)
                       if chunk.choices)
    assert streamed == text


def test_choice_and_ebnf_with_n(client, model):
    response = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10, n=3, temperature=1.0,
                                              seed=4, extra_body={"choice": ["north", "south", "east", "west"]})
    assert [c.message.content in ("north", "south", "east", "west") for c in response.choices] == [True] * 3
    grammar = 'root ::= "(" [0-9] ("," [0-9])* ")"'
    response = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=30, temperature=0,
                                              extra_body={"ebnf": grammar})
    if response.choices[0].finish_reason == "stop":
        assert re.fullmatch(r"\(\d(,\d)*\)", response.choices[0].message.content)


def test_structured_outputs_field_like_vllm(client, model):
    response = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10, temperature=0,
                                              extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert response.choices[0].message.content in ("yes", "no")
