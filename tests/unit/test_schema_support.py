"""JSON Schema the grammar cannot enforce is refused, naming the keyword (issue 34, row 6); what it enforces is
checked on xgrammar itself, so that a library upgrade that changes either side fails here."""

from __future__ import annotations

import pytest

from radixlm.structured.grammar_spec import GrammarSpec

DEFS = {"$defs": {"i": {"type": "integer"}}}

REFUSED = [
    ({"type": "integer", "not": {"const": 1}}, "'not'"),
    ({"type": "object", "properties": {"x": {"not": {"type": "string"}}}},
     r"'not' is not supported \(at #/properties/x\)"),
    ({"$ref": "http://example.com/schema.json"}, "nothing is fetched"),
    ({"$ref": "file:///etc/passwd"}, "nothing is fetched"),
    ({"$ref": "other.json#/x"}, "nothing is fetched"),
    ({"$defs": {"i": {"$anchor": "int", "type": "integer"}}, "$ref": "#int"}, "anchors"),
    ({"$ref": 5}, "'\\$ref' '5'"),
    ({"$dynamicRef": "#meta"}, "'\\$dynamicRef'"),
    ({"$recursiveRef": "#"}, "'\\$recursiveRef'"),
    ({"allOf": [{"minimum": 5}, {"type": "integer"}]}, "'allOf' with 2 schemas"),
    ({**DEFS, "$ref": "#/$defs/i", "minimum": 5}, "'minimum' beside '\\$ref'"),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}], "minimum": 5}, "'minimum' beside 'anyOf'"),
    ({"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, "'type' beside 'anyOf'"),
    ({"oneOf": [{"type": "integer"}], "maximum": 1}, "'maximum' beside 'oneOf'"),
    ({"type": "array", "items": {"type": "string", "format": "idn-email"}},
     r"'idn-email' is not supported \(at #/items\)"),
    ({"type": "string", "format": "regex"}, "'regex'"),
]


@pytest.mark.parametrize(("schema", "message"), REFUSED)
def test_unenforceable_schemas_are_refused_naming_the_keyword(schema, message):
    with pytest.raises(ValueError, match=f"^json_schema: .*{message}"):
        GrammarSpec.from_json_schema(schema)
    tag = {"type": "structural_tag", "format": {"type": "json_schema", "json_schema": schema}}
    with pytest.raises(ValueError, match=message):
        GrammarSpec.from_structural_tag(tag)


PYDANTIC_LIKE = [
    {**DEFS, "$ref": "#/$defs/i", "description": "a documented reference", "default": 1, "title": "X"},
    {**DEFS, "allOf": [{"$ref": "#/$defs/i"}], "description": "pydantic 1's way to document a reference"},
    {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Optional"},
    {"oneOf": [{"type": "integer"}, {"type": "string"}], "discriminator": {"propertyName": "kind"}},
    {"type": "object", "properties": {"not": {"type": "string"}, "$ref": {"type": "integer"}}},  # keys, not keywords
    {"enum": [{"not": 1}, {"$ref": "http://x"}]},  # data, not schemas
    {"const": {"allOf": [1, 2]}, "examples": [{"not": {}}]},
    {"type": "integer", "format": "int32"},  # not JSON Schema's: an annotation
    {"type": "string", "format": "date-time"},
]


@pytest.mark.parametrize("schema", PYDANTIC_LIKE)
def test_common_generated_schemas_are_accepted(schema):
    GrammarSpec.from_json_schema(schema)


ENFORCED = [  # (schema, an instance it forbids): each must be refused by the compiled grammar
    ({"type": "integer", "minimum": 5}, "4"),
    ({"type": "integer", "multipleOf": 5}, "6"),
    ({"type": "string", "pattern": "^a+$"}, '"b"'),
    ({"type": "string", "format": "email"}, '"b"'),
    ({"type": "array", "uniqueItems": True}, "[1,1]"),
    ({"type": "array", "prefixItems": [{"type": "string"}], "items": False}, "[1]"),
    ({"type": "object", "patternProperties": {"^a": {"type": "integer"}}, "additionalProperties": False},
     '{"a":"s"}'),
    ({"type": "object", "propertyNames": {"pattern": "^a"}}, '{"b":1}'),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependentRequired": {"a": ["b"]}}, '{"a":1}'),
    ({"type": "object", "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, '{"a":1}'),
    ({"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, '"s"'),
    ({**DEFS, "$ref": "#/$defs/i"}, '"s"'),
    ({"allOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}]}, '{"x":"s"}'),
]


@pytest.mark.parametrize(("schema", "forbidden"), ENFORCED)
def test_what_is_accepted_is_enforced(backend, tokenizer, schema, forbidden):
    matcher = backend.new_matcher(backend.compile(GrammarSpec.from_json_schema(schema)))
    token_ids = [*tokenizer.encode(forbidden, add_special_tokens=False), tokenizer.eos_token_id]
    assert not all(matcher.accept_token(token_id) for token_id in token_ids)
