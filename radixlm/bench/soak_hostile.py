"""The requests of `radixlm bench soak --hostile`: three attacks found by a probe, and the tiny requests that time
how much they delay other clients.

- memory: chat requests (`max_tokens: 1`) each carrying a distinct ~84 KB `json_schema` of ~1,500 patterned string
  properties, through `response_format` and through `tools` with `tool_choice: "required"`; every distinct schema
  compiles to a large grammar, so an unbounded compile cache grows without end. A 200 or a 400 (a schema refused
  as too big) is fine.
- framing: a raw-socket POST with both `Content-Length` and `Transfer-Encoding: chunked`, whose Content-Length
  span holds a second request; exactly one response is right (a 400 with `Connection: close`, then the server
  closes the socket). An answer to the embedded request is a smuggled one.
- tokenizer load: 128 tools of 100 KB descriptions each, and an assistant history of 12 MB of tool-call arguments;
  a quick 400 (too long for the context, refused before templating) or a 200.

Builders only (no I/O): the bodies are bytes, built before the attack phase so that the client's own work does not
show up in the latencies it measures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

CHAT = "/v1/chat/completions"
NUM_SCHEMA_PROPERTIES = 1_500
NUM_SCHEMA_TOOLS = 2  # two ~84 KB schemas stay under the server's 256 KiB limit on one spec
NUM_BIG_TOOLS = 128  # the server's most tools a request
BIG_DESCRIPTION_CHARS = 100 * 1024
BIG_ARGUMENTS_CHARS = 12_000_000
SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: soak\r\n\r\n"
FRAMING_BODY = b'{"prompt": "the quick", "max_tokens": 1}'
KIND_SCHEMA = "schema"
KIND_TOOL_SCHEMA = "tool-schema"
KIND_BIG_TOOLS = "big-tools"
KIND_BIG_ARGUMENTS = "big-arguments"
KIND_FRAMING = "framing"
ATTACK_KINDS = (KIND_SCHEMA, KIND_TOOL_SCHEMA, KIND_FRAMING, KIND_BIG_TOOLS, KIND_BIG_ARGUMENTS)
WORDS = ["alpha", "bravo", "cedar", "delta", "ember", "fjord", "gamma", "harbor", "indigo", "juniper"]


@dataclass(frozen=True)
class HostileRequest:
    """One attack: `body` is what goes on the wire (for framing, the whole raw request); `allowed` the statuses a
    healthy server may answer (framing is judged by `classify_framing` instead)."""

    kind: str
    route: str
    body: bytes
    allowed: frozenset[int] = frozenset({200, 400})


def pattern_schema(seed: int, num_properties: int = NUM_SCHEMA_PROPERTIES) -> dict[str, object]:
    """An object schema of `num_properties` string properties, each with a `pattern`; the names and the patterns'
    bounds depend on `seed`, so two seeds give two schemas (and two grammars) of about the same size."""
    properties = {}
    for index in range(num_properties):
        low = 1 + (seed + index) % 3
        high = low + 1 + (seed * 7 + index) % 7
        properties[f"f{seed:x}_{index:04d}"] = {"type": "string", "pattern": f"^[a-z]{{{low},{high}}}$"}
    return {"type": "object", "properties": properties}


def _chat_body(content: str, **fields: object) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0,
                       **fields}).encode()


def schema_request(seed: int) -> HostileRequest:
    """Row 1 through `response_format`: a distinct ~84 KB schema per seed."""
    response_format = {"type": "json_schema", "json_schema": {"name": f"form_{seed}", "schema": pattern_schema(seed)}}
    return HostileRequest(KIND_SCHEMA, CHAT, _chat_body(f"Fill in form {seed}.", response_format=response_format))


def tool_schema_request(seed: int) -> HostileRequest:
    """Row 1 through `tools` with `tool_choice: "required"`: a few tools, each with its own distinct schema."""
    tools = [{"type": "function", "function": {"name": f"fill_{seed}_{k}", "description": "Fill in a form.",
                                               "parameters": pattern_schema(seed * NUM_SCHEMA_TOOLS + k)}}
             for k in range(NUM_SCHEMA_TOOLS)]
    return HostileRequest(KIND_TOOL_SCHEMA, CHAT, _chat_body(f"Fill in forms {seed}.", tools=tools,
                                                             tool_choice="required"))


def _filler(num_chars: int, seed: int) -> str:
    """Plain words (nothing JSON escapes), exactly `num_chars` long."""
    unit = " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(len(WORDS))) + " "
    return (unit * (num_chars // len(unit) + 1))[:num_chars]


def big_tools_request(seed: int = 0) -> HostileRequest:
    """Row 3: 128 tools, each described by 100 KB of text (about 13 MB of body, under the 16 MiB default limit)."""
    description = _filler(BIG_DESCRIPTION_CHARS, seed)
    tools = [{"type": "function", "function": {"name": f"tool_{k}", "description": description,
                                               "parameters": {"type": "object", "properties": {}}}}
             for k in range(NUM_BIG_TOOLS)]
    return HostileRequest(KIND_BIG_TOOLS, CHAT, _chat_body("Which tool fits?", tools=tools))


def big_arguments_request(seed: int = 0) -> HostileRequest:
    """Row 3: an assistant turn whose one tool call carries 12 MB of `arguments` (a JSON object's text)."""
    head = '{"notes": "'
    arguments = head + _filler(BIG_ARGUMENTS_CHARS - len(head) - 2, seed) + '"}'
    call = {"id": "call_0", "type": "function", "function": {"name": "save_notes", "arguments": arguments}}
    messages = [{"role": "user", "content": "Save my notes."},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_0", "content": "saved"},
                {"role": "user", "content": "Thanks. What did you save?"}]
    body = json.dumps({"messages": messages, "max_tokens": 1, "temperature": 0}).encode()
    return HostileRequest(KIND_BIG_ARGUMENTS, CHAT, body)


def framing_request() -> HostileRequest:
    """Row 2: a chunked body that ends early, inside a Content-Length span that also holds `SMUGGLED`. A server
    reading the chunks would see `SMUGGLED` as the next request; one reading Content-Length would not."""
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(FRAMING_BODY), FRAMING_BODY)
    span = chunked + SMUGGLED
    head = ["POST /v1/completions HTTP/1.1", "Host: soak", "Content-Type: application/json",
            f"Content-Length: {len(span)}", "Transfer-Encoding: chunked"]
    raw = ("\r\n".join(head) + "\r\n\r\n").encode() + span
    return HostileRequest(KIND_FRAMING, "/v1/completions", raw, allowed=frozenset(range(100, 500)))


def build_attacks(num_each: int, seed: int) -> list[HostileRequest]:
    """`num_each` attacks of every kind, interleaved; the two big bodies are shared (their size is the attack,
    not their content), the schemas are all distinct."""
    big_tools, big_arguments, framing = big_tools_request(seed), big_arguments_request(seed), framing_request()
    attacks = []
    for index in range(num_each):
        attacks += [schema_request(seed * 100_003 + index), tool_schema_request(seed * 100_003 + index), framing,
                    big_tools, big_arguments]
    return attacks


def tiny_requests() -> list[tuple[str, bytes]]:
    """The tiny requests that time the delay other clients see: (route, body), sent in turn."""
    return [("/tokenize", json.dumps({"prompt": "the quick brown fox"}).encode()),
            (CHAT, _chat_body("Hi!"))]


Response = tuple[int, dict[str, str], bytes]


def parse_responses(data: bytes) -> list[Response]:
    """Back-to-back HTTP/1.1 responses as (status, lower-cased headers, body), each framed by its Content-Length
    (one without runs to the end); ValueError for bytes that are not a response."""
    responses = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].startswith("HTTP/"):
            raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", len(rest)))
        responses.append((int(lines[0].split()[1]), headers, rest[:length]))
        data = rest[length:]
    return responses


def classify_framing(responses: list[Response], closed: bool) -> str:
    """"refused" (the one right outcome: a single 400 with `Connection: close`, then the socket closed),
    "smuggled" (more than one response: the embedded request was answered), else a short description."""
    if len(responses) > 1:
        return "smuggled"
    if not responses:
        return "closed without a response" if closed else "no response"
    status, headers, _ = responses[0]
    if status != 400:
        return f"answered {status}"
    if headers.get("connection", "").lower() != "close":
        return "400 without Connection: close"
    return "refused" if closed else "400 but the socket stayed open"
