"""GrammarSpec: what a request's output must match, in a canonical, hashable form (the compile-cache key)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "ebnf", "choice")


@dataclass(frozen=True)
class GrammarSpec:
    """`kind` is one of GRAMMAR_KINDS; `text` is the schema as canonical JSON, the regex, the EBNF grammar, or the
    choices as a JSON list. Build it with the `from_*` helpers, which validate the input."""

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"structured output kind must be one of {GRAMMAR_KINDS}, got {self.kind!r}")
        if self.kind != "json_object" and not self.text:
            raise ValueError(f"{self.kind} needs a non-empty grammar")

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object")

    @classmethod
    def from_json_schema(cls, schema: dict[str, Any] | str) -> GrammarSpec:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise ValueError(f"json_schema is not valid JSON: {error}") from None
        if not isinstance(schema, dict):
            raise ValueError(f"json_schema must be a JSON object, got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema, sort_keys=True, separators=(",", ":")))

    @classmethod
    def from_regex(cls, pattern: str) -> GrammarSpec:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("regex must be a non-empty string")
        return cls("regex", pattern)

    @classmethod
    def from_ebnf(cls, grammar: str) -> GrammarSpec:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ValueError("ebnf must be a non-empty grammar string")
        return cls("ebnf", grammar)

    @classmethod
    def from_choice(cls, choices: list[str]) -> GrammarSpec:
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError("choice must be a non-empty list of non-empty strings")
        return cls("choice", json.dumps(choices, ensure_ascii=False))

    def as_ebnf_choice(self) -> str:
        """The choice list as an EBNF grammar (JSON string escapes are valid EBNF string literals)."""
        return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in json.loads(self.text))
