"""Constrained decoding on the default model: JSON schemas (nested objects, arrays with min/max items, enums,
integer ranges, string patterns, optional fields, $ref, ...) all parse and validate; regexes fullmatch; EBNF
parses. Only outputs cut by max_tokens are exempt, and most must not be cut."""

import json
import re

import jsonschema
import pytest

from e2e.test_structured_engine import EBNF, ebnf_ok
from radixlm import LLM, SamplingParams

pytestmark = pytest.mark.slow

NAME = {"type": "string", "maxLength": 16}
SCHEMAS = {
    "a person": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0,
                                                                        "maximum": 120}},
                 "required": ["name", "age"]},
    "a user account": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "email": {
            "type": "string", "pattern": "^[a-z]{2,8}@[a-z]{2,8}\\.com$"}}, "required": ["id", "email"]},
        "active": {"type": "boolean"}}, "required": ["user", "active"]},
    "a blog post's tags": {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 3}},
        "required": ["tags"]},
    "a colour": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                 "required": ["color"]},
    "a review score": {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 10}},
                       "required": ["score"]},
    "a US address": {"type": "object", "properties": {"city": NAME, "zip": {"type": "string",
                                                                           "pattern": "^[0-9]{5}$"}},
                     "required": ["city", "zip"]},
    "a book": {"type": "object", "properties": {"title": NAME, "subtitle": NAME, "year": {"type": "integer"}},
               "required": ["title"]},
    "a line segment": {"$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}},
        "type": "object", "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"]},
    "a shopping list": {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"name": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["name", "qty"]}}}, "required": ["items"]},
    "a price": {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 1000},
                                                 "currency": {"enum": ["USD", "EUR"]}},
                "required": ["price", "currency"]},
    "a 2x2 matrix": {"type": "object", "properties": {"matrix": {"type": "array", "minItems": 2, "maxItems": 2,
                                                                 "items": {"type": "array", "minItems": 2,
                                                                           "maxItems": 2,
                                                                           "items": {"type": "integer"}}}},
                     "required": ["matrix"]},
    "a task": {"type": "object", "properties": {"done": {"type": "boolean"},
                                                "priority": {"anyOf": [{"type": "integer"}, {"enum": ["low", "high"]}]},
                                                "note": {"type": ["string", "null"], "maxLength": 12}},
               "required": ["done", "priority", "note"]},
    "a version record": {"type": "object", "properties": {"version": {"const": "1.0"},
                                                          "build": {"type": "integer", "minimum": 100}},
                         "required": ["version", "build"], "additionalProperties": False},
}
REGEXES = {"a phone number": r"\(\d{3}\) \d{3}-\d{4}", "an email address": r"[a-z]{3,8}@[a-z]{3,8}\.(com|org)",
           "a date": r"\d{4}-\d{2}-\d{2}"}


def ask(llm, what):
    return llm.apply_chat_template([{"role": "user", "content": f"Give me {what}. Answer in the requested format."}])


def test_default_model_outputs_are_valid_by_construction():
    llm = LLM(num_kv_blocks=1024)
    cases = [(what, {"json": schema}) for what, schema in SCHEMAS.items()]
    cases += [(what, {"regex": regex}) for what, regex in REGEXES.items()]
    cases += [("an arithmetic expression", {"grammar": EBNF})]
    params = [SamplingParams(temperature=0.0, max_tokens=160, structured_outputs=spec) for _, spec in cases]
    outputs = llm.generate([ask(llm, what) for what, _ in cases], params, use_tqdm=False)
    truncated = []
    for (what, spec), output in zip(cases, outputs, strict=True):
        completion = output.outputs[0]
        if completion.finish_reason == "length":
            truncated.append(what)
            continue
        assert completion.finish_reason == "stop", (what, completion.finish_reason)
        if "json" in spec:
            jsonschema.validate(json.loads(completion.text), spec["json"])
        elif "regex" in spec:
            assert re.fullmatch(spec["regex"], completion.text), (what, completion.text)
        else:
            assert ebnf_ok(completion.text), completion.text
    assert len(SCHEMAS) >= 12
    assert len(truncated) <= 2, f"too many outputs cut by max_tokens: {truncated}"
