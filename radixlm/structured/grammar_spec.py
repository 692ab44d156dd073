"""GrammarSpec: what a request's output must match, in a compact, hashable form (the compile-cache key). JSON specs keep
their key order: a schema's properties are generated in the order it lists them (chain-of-thought schemas put
`reasoning` before `answer` on purpose), as OpenAI and vLLM generate them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from radixlm.config_values import parse_json_object
from radixlm.structured.schema_support import check_enforceable, check_structural_tag

GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "ebnf", "choice", "structural_tag")

# Size limits, so that no client can hold the (one) compile thread for long: xgrammar's compile time grows with the
# square of a regex's or a literal string's length (65,536 characters: 10 s for a regex, 1 s for one choice; 16,384:
# under 0.7 s and 0.1 s) and faster than linearly with nesting (a schema 880 levels deep took 32 s; 100 levels take
# 0.1 s). Long lists of short items compile in linear time (4,096 choices: 0.08 s).
MAX_GRAMMAR_CHARS = 16_384  # a regex, an EBNF grammar, one choice, or one string (key or value) of a JSON spec
MAX_SPEC_CHARS = 262_144  # a whole schema or structural tag, or all the choices
MAX_SPEC_DEPTH = 100  # JSON nesting of a schema or structural tag
MAX_CHOICES = 4_096


def check_json_spec(value: Any, name: str) -> None:
    """A ValueError naming `name` when a JSON spec (schema or structural tag) nests deeper than MAX_SPEC_DEPTH or
    holds a string (key or value) longer than MAX_GRAMMAR_CHARS. Iterative: any depth is safe to check."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_SPEC_DEPTH:
            raise ValueError(f"{name} is nested deeper than {MAX_SPEC_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((key, depth + 1) for key in item)
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str) and len(item) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"{name} holds a string of {len(item)} characters; the limit is {MAX_GRAMMAR_CHARS}")


def _check_length(text: str, limit: int, name: str) -> str:
    if len(text) > limit:
        raise ValueError(f"{name} is {len(text)} characters long; the limit is {limit}")
    return text


@dataclass(frozen=True)
class GrammarSpec:
    """`kind` is one of GRAMMAR_KINDS; `text` is the schema as compact JSON in its own key order, the regex, the
    EBNF grammar, the choices as a JSON list, or an xgrammar structural tag as compact JSON (tool calls, text after
    reasoning). Build it with the `from_*` helpers, which validate the input."""

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"structured output kind must be one of {GRAMMAR_KINDS}, got {self.kind!r}")
        if not isinstance(self.text, str):
            raise ValueError(f"{self.kind} grammar text must be a string, got {type(self.text).__name__}")
        if self.kind != "json_object" and not self.text:
            raise ValueError(f"{self.kind} needs a non-empty grammar")
        # A spec built directly (e.g. from a SamplingParams dict) gets the limits the `from_*` helpers apply.
        _check_length(self.text, MAX_GRAMMAR_CHARS if self.kind in ("regex", "ebnf") else MAX_SPEC_CHARS, self.kind)

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object")

    @classmethod
    def from_json_schema(cls, schema: dict[str, Any] | str) -> GrammarSpec:
        if isinstance(schema, str):
            _check_length(schema, MAX_SPEC_CHARS, "json_schema")
        schema = parse_json_object(schema, "json_schema")
        check_json_spec(schema, "json_schema")
        check_enforceable(schema, "json_schema")
        text = json.dumps(schema, separators=(",", ":"))  # key order kept: properties are generated in it
        return cls("json_schema", _check_length(text, MAX_SPEC_CHARS, "json_schema"))

    @classmethod
    def from_regex(cls, pattern: str) -> GrammarSpec:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("regex must be a non-empty string")
        return cls("regex", _check_length(pattern, MAX_GRAMMAR_CHARS, "regex"))

    @classmethod
    def from_ebnf(cls, grammar: str) -> GrammarSpec:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ValueError("ebnf must be a non-empty grammar string")
        return cls("ebnf", _check_length(grammar, MAX_GRAMMAR_CHARS, "ebnf"))

    @classmethod
    def from_choice(cls, choices: list[str]) -> GrammarSpec:
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError("choice must be a non-empty list of non-empty strings")
        if len(choices) > MAX_CHOICES:
            raise ValueError(f"choice has {len(choices)} entries; the limit is {MAX_CHOICES}")
        for choice in choices:
            _check_length(choice, MAX_GRAMMAR_CHARS, "a choice")
        return cls("choice", _check_length(json.dumps(choices, ensure_ascii=False), MAX_SPEC_CHARS, "choice"))

    @classmethod
    def from_structural_tag(cls, tag: dict[str, Any]) -> GrammarSpec:
        """An xgrammar structural tag ({"type": "structural_tag", "format": {...}}); the backend checks the rest."""
        if not isinstance(tag, dict) or tag.get("type") != "structural_tag" or not isinstance(tag.get("format"), dict):
            raise ValueError('structural_tag must be {"type": "structural_tag", "format": {...}}')
        check_json_spec(tag, "structural_tag")
        check_structural_tag(tag, "structural_tag")
        text = json.dumps(tag, separators=(",", ":"), ensure_ascii=False)
        return cls("structural_tag", _check_length(text, MAX_SPEC_CHARS, "structural_tag"))

    def as_format(self) -> dict[str, Any]:
        """This constraint as a structural-tag format, so that it can follow other text (e.g. reasoning)."""
        if self.kind == "structural_tag":
            return json.loads(self.text)["format"]
        if self.kind in ("json_object", "json_schema"):
            schema = json.loads(self.text) if self.kind == "json_schema" else {"type": "object"}
            return {"type": "json_schema", "json_schema": schema}
        if self.kind == "regex":
            return {"type": "regex", "pattern": self.text}
        if self.kind == "choice":
            return {"type": "or", "elements": [{"type": "const_string", "value": c} for c in json.loads(self.text)]}
        return {"type": "grammar", "grammar": self.text}

    def as_ebnf_choice(self) -> str:
        """The choice list as an EBNF grammar (JSON string escapes are valid EBNF string literals)."""
        return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in json.loads(self.text))
