"""What of JSON Schema the grammar engine enforces: a schema using anything else is refused, never run loosely.

xgrammar 0.2.9 compiles most of JSON Schema into its grammar (types, enum/const, numeric bounds and multipleOf,
string lengths, patterns and the common formats, array and object bounds, prefixItems, patternProperties,
propertyNames, additionalProperties, dependent keywords, if/then/else, anyOf, local `$ref`s), but some keywords
compile without effect or with the wrong effect, measured on it (each row: an instance the schema forbids that
the grammar let through, or one it allows that the grammar refused):

- `not`: ignored at the top of a schema, and refused valid instances inside `properties`;
- `allOf` with two or more schemas: `[{"minimum": 5}, {"type": "integer"}]` let 3 through, two object schemas
  refused an instance of both;
- keywords beside `$ref`, `allOf`, `anyOf` or `oneOf` that assert something (`{"$ref": ..., "minimum": 5}`): ignored;
- `$ref` to anything but a JSON pointer inside the schema (`http://...`, `file:...`, `other.json#/x`, `#anchor`),
  `$dynamicRef`, `$recursiveRef`: the reference is never resolved (nothing is fetched) and any JSON matched it;
- the formats iri, iri-reference, idn-email, idn-hostname and regex: any string matched.

So `check_enforceable` refuses those (a ValueError naming the keyword and where it is). `oneOf` is enforced as
`anyOf` (an output matching two branches is allowed), as vLLM and SGLang do. Formats JSON Schema does not define
(OpenAPI's int32, byte, ...) are annotations, as the specification says of unknown formats, and are left alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

UNENFORCED_FORMATS = frozenset({"iri", "iri-reference", "idn-email", "idn-hostname", "regex"})
# Keywords that say nothing about which instances are valid: they may stand beside $ref / allOf / anyOf / oneOf.
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
                         "$comment", "$id", "$schema", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$defs",
                         "definitions", "discriminator", "contentEncoding", "contentMediaType", "contentSchema"})
COMBINATORS = ("$ref", "allOf", "anyOf", "oneOf")
_ONE_SCHEMA = ("items", "additionalItems", "additionalProperties", "contains", "propertyNames", "if", "then", "else",
               "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")


def check_enforceable(schema: Any, name: str) -> None:
    """A ValueError naming `name`, the keyword and its place (`#/properties/x`) when `schema` uses JSON Schema the
    grammar cannot enforce (see the module docstring). Iterative: any depth is safe."""
    for node, path in _subschemas(schema):
        problem = _problem(node)
        if problem is not None:
            raise ValueError(f"{name}: {problem} (at #{path}); this server enforces every schema it accepts "
                             f"and cannot enforce that")


def check_structural_tag(tag: Any, name: str) -> None:
    """`check_enforceable` on every JSON schema inside an xgrammar structural tag."""
    stack = [tag]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("type") == "json_schema" and "json_schema" in item:
                check_enforceable(item["json_schema"], name)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _problem(node: dict[str, Any]) -> str | None:
    """What of this one schema object cannot be enforced, or None."""
    if "not" in node:
        return "'not' is not supported"
    for keyword in ("$dynamicRef", "$recursiveRef"):
        if keyword in node:
            return f"{keyword!r} is not supported"
    ref = node.get("$ref")
    if ref is not None and not (isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))):
        return (f"'$ref' {str(ref)[:80]!r} is not a reference inside the schema ('#/...'); nothing is fetched, so "
                f"URLs, files and anchors are not supported")
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        return f"'allOf' with {len(all_of)} schemas is not supported; merge them into one schema"
    combinators = [keyword for keyword in COMBINATORS if keyword in node]
    if combinators:
        siblings = sorted(key for key in node if key not in ANNOTATIONS and key != combinators[0])
        if siblings:
            return (f"{siblings[0]!r} beside {combinators[0]!r} is not supported; move it into the schemas "
                    f"{combinators[0]!r} names")
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in UNENFORCED_FORMATS:
        return f"'format' {fmt!r} is not supported"
    return None


def _subschemas(schema: Any) -> Iterator[tuple[dict[str, Any], str]]:
    """Every schema object in `schema` (itself included) with its JSON pointer; values of `enum`, `const`,
    `default` and `examples` are data, not schemas, and are not entered."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        yield node, path
        for keyword in _ONE_SCHEMA:
            if isinstance(node.get(keyword), dict):
                stack.append((node[keyword], f"{path}/{keyword}"))
        for keyword in _SCHEMA_LISTS:
            if isinstance(node.get(keyword), list):
                stack.extend((item, f"{path}/{keyword}/{i}") for i, item in enumerate(node[keyword]))
        for keyword in _SCHEMA_MAPS:
            if isinstance(node.get(keyword), dict):
                stack.extend((item, f"{path}/{keyword}/{_escape(key)}") for key, item in node[keyword].items())


def _escape(key: str) -> str:
    """A key as a JSON pointer token (RFC 6901), cut short: it is only shown."""
    return key.replace("~", "~0").replace("/", "~1")[:64]
