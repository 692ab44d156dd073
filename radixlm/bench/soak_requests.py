"""The request mix of `radixlm bench soak`: valid requests of every kind, clients that disconnect, malformed bodies.

Each `SoakRequest` says what to send and what a healthy server answers: a 2xx for a valid body, a 4xx for a
malformed one, and never a 5xx or a dropped connection (except the ones the client drops on purpose).
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass

TOPICS = ["the sea", "a paged KV cache", "Paris", "prime numbers", "a radix tree", "the moon", "coffee", "rain"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}}, "required": ["name", "age"]}
# Raw bodies a client may send by mistake or on purpose; each must get a 4xx with an OpenAI error body.
MALFORMED = [
    '{"prompt": "hi", "max_tokens": 4',  # cut short
    '{"prompt": 5, "max_tokens": 4}',
    '{"messages": "hi", "max_tokens": 4}',
    '{"prompt": "hi", "max_tokens": -1}',
    '{"prompt": "hi", "temperature": "hot"}',
    '{"prompt": "hi", "max_tokens": 4, "n": 100000}',
    '{"prompt": "hi", "max_tokens": 4, "best_of": 1000000000}',
    '{"prompt": "\\ud800 lone surrogate", "max_tokens": 4}',
    '{"prompt": "hi", "max_tokens": 4, "logit_bias": {"' + "9" * 5000 + '": 1}}',
    '{"prompt": "hi", "max_tokens": 4, "top_p": NaN}',
    '{"prompt": "hi", "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {"name": "x", '
    '"schema": {"type": "bogus"}}}}',
    '{"messages": [], "max_tokens": 4}',
    '[1, 2, 3]',
]


@dataclass
class SoakRequest:
    route: str  # /v1/completions or /v1/chat/completions
    body: str  # the raw JSON text
    stream: bool
    malformed: bool
    disconnect_after: float | None  # seconds after which the client gives up (None: it waits for the answer)
    greedy_probe: bool = False


def build_requests(num_requests: int, seed: int, disconnect_fraction: float = 0.2,
                   malformed_fraction: float = 0.05) -> list[SoakRequest]:
    rng = random.Random(seed)
    requests = []
    malformed = itertools.cycle(MALFORMED)  # every kind, in turn
    for index in range(num_requests):
        draw = rng.random()
        if draw < malformed_fraction:
            body = next(malformed)
            route = "/v1/chat/completions" if '"messages"' in body else "/v1/completions"
            requests.append(SoakRequest(route, body, False, True, None))
            continue
        disconnect = rng.uniform(0.05, 2.0) if draw < malformed_fraction + disconnect_fraction else None
        requests.append(valid_request(rng, index, disconnect))
    return requests


def valid_request(rng: random.Random, index: int, disconnect_after: float | None) -> SoakRequest:
    """A valid request mixing streaming, n > 1, grammars, stops, logprobs, seeds and penalties."""
    chat = rng.random() < 0.6
    stream = rng.random() < 0.5
    topic = rng.choice(TOPICS)
    body: dict[str, object] = {"max_tokens": rng.randint(4, 24), "temperature": rng.choice([0, 0.7, 1.0]),
                               "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": f"Tell me about {topic}. (#{index})"}]
    else:
        body["prompt"] = f"Here is a short note about {topic}:"
    kind = rng.random()
    if kind < 0.15:
        body["n"] = rng.randint(2, 3)
    elif kind < 0.30 and chat:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    elif kind < 0.40:
        body["choice" if not chat else "guided_choice"] = ["yes", "no", "maybe"]
    elif kind < 0.55:
        body["stop"] = rng.sample([".", "\n", " the", "!"], 2)
    if rng.random() < 0.2:
        body["logprobs"] = True if chat else 2
        if chat:
            body["top_logprobs"] = 2
    if rng.random() < 0.2:
        body["seed"] = rng.randint(0, 1000)
        body["presence_penalty"] = 0.5
    if stream and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    route = "/v1/chat/completions" if chat else "/v1/completions"
    return SoakRequest(route, json.dumps(body), stream, False, disconnect_after)


def greedy_probes() -> list[SoakRequest]:
    """Fixed greedy requests, asked before and after the soak: their answers must not change."""
    probes = []
    for topic in TOPICS[:4]:
        body = {"messages": [{"role": "user", "content": f"Say something about {topic}."}], "max_tokens": 24,
                "temperature": 0}
        probes.append(SoakRequest("/v1/chat/completions", json.dumps(body), False, False, None, greedy_probe=True))
    return probes
