"""Structured-output fields of a request -> one GrammarSpec.

Accepted, as OpenAI, vLLM and SGLang spell them: `response_format` ({"type": "json_object"}, {"type":
"json_schema", "json_schema": {"name", "schema", "strict"}} or {"type": "text"}), `regex`, `ebnf`, `choice`,
`json_schema` (SGLang), `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` (vLLM) and
`structured_outputs` (vLLM: {"json" | "regex" | "choice" | "grammar" | "json_object": ...}). At most one may be set.
Every error message starts with the field's name, so the 400 body's `param` names it.
"""

from __future__ import annotations

from typing import Any

from radixlm.errors import ParamError
from radixlm.sampling_params import structured_spec
from radixlm.structured.grammar_spec import GrammarSpec

GRAMMAR_FIELDS = ("response_format", "regex", "ebnf", "choice", "json_schema", "guided_json", "guided_regex",
                  "guided_choice", "guided_grammar", "structured_outputs")


def _response_format(value: Any) -> GrammarSpec | None:
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise ParamError('response_format', 'must be {"type": "text" | "json_object" | "json_schema", ...}')
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return GrammarSpec.json_object()
    schema_holder = value.get("json_schema")
    if not isinstance(schema_holder, dict) or "schema" not in schema_holder:
        raise ParamError('response_format', 'with type "json_schema" needs {"json_schema": {"name", "schema"}}')
    return GrammarSpec.from_json_schema(schema_holder["schema"])


_BUILDERS = {
    "response_format": _response_format,
    "regex": GrammarSpec.from_regex,
    "guided_regex": GrammarSpec.from_regex,
    "ebnf": GrammarSpec.from_ebnf,
    "guided_grammar": GrammarSpec.from_ebnf,
    "choice": GrammarSpec.from_choice,
    "guided_choice": GrammarSpec.from_choice,
    "json_schema": GrammarSpec.from_json_schema,
    "guided_json": GrammarSpec.from_json_schema,
    "structured_outputs": lambda value: structured_spec(value) if isinstance(value, dict) else _not_a_dict(),
}


def _not_a_dict() -> GrammarSpec:
    raise ValueError("must be an object such as {\"json\": {...}} or {\"regex\": \"...\"}")


def grammar_from_fields(values: dict[str, Any]) -> tuple[GrammarSpec | None, str | None]:
    """(spec, the field it came from) for the set grammar fields of a request; ValueError names the field."""
    chosen = [name for name in GRAMMAR_FIELDS if values.get(name) is not None]
    if len(chosen) > 1:
        raise ParamError(chosen[1], f"cannot be combined with {chosen[0]}: set one structured-output field")
    if not chosen:
        return None, None
    field = chosen[0]
    try:
        return _BUILDERS[field](values[field]), field
    except ValueError as error:
        message = str(error).removeprefix("structured_outputs: ")
        raise ParamError(field, message, ": ") from None
