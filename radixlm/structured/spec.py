"""GrammarSpec: what a request's output must match, in a canonical, hashable form (the compile-cache key)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from radixlm.config import parse_json_object

GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "ebnf", "choice", "structural_tag")


@dataclass(frozen=True)
class GrammarSpec:
    """`kind` is one of GRAMMAR_KINDS; `text` is the schema as canonical JSON, the regex, the EBNF grammar, the
    choices as a JSON list, or an xgrammar structural tag as canonical JSON (tool calls, text after reasoning).
    Build it with the `from_*` helpers, which validate the input."""

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
        schema = parse_json_object(schema, "json_schema")
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

    @classmethod
    def from_structural_tag(cls, tag: dict[str, Any]) -> GrammarSpec:
        """An xgrammar structural tag ({"type": "structural_tag", "format": {...}}); the backend checks the rest."""
        if not isinstance(tag, dict) or tag.get("type") != "structural_tag" or not isinstance(tag.get("format"), dict):
            raise ValueError('structural_tag must be {"type": "structural_tag", "format": {...}}')
        return cls("structural_tag", json.dumps(tag, sort_keys=True, separators=(",", ":"), ensure_ascii=False))

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
