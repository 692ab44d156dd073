"""`radixlm bench soak --lora`: adapters used, loaded and unloaded under load; the server must come out as it went in.

Two random-weight adapters are loaded at start (`--lora-modules`); a fifth of the mix's valid requests switch to one
of them (`model`). Meanwhile a churn task loads a third adapter, asks it a greedy question, tries to unload it while a
request still runs on it (a 400 is the right answer), unloads it once that request ended, and starts over: each
cycle's answer must equal the first. The verdict adds: every load and unload answered as expected, the resident
adapters' greedy answers the same before and after, and the base model's probes (the soak's own) unchanged.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from radixlm.bench.soak_requests import SoakRequest, greedy_probes

LORA_FRACTION = 0.2
RESIDENT = ("lora0", "lora1")
CHURN = "churn0"


@dataclass
class LoRASoak:
    """The adapters' directories (by name), and what the churn saw."""

    paths: dict[str, Path]
    num_cycles: int = 0
    num_refused_in_use: int = 0
    answers: list[str | None] = field(default_factory=list)  # the churn adapter's greedy answer, per cycle
    problems: list[str] = field(default_factory=list)

    def note(self, problem: str) -> None:
        if len(self.problems) < 10:
            self.problems.append(problem)


def with_adapters(requests: list[SoakRequest], seed: int) -> list[SoakRequest]:
    """The mix with `LORA_FRACTION` of its valid requests running a resident adapter instead of the base model."""
    rng = random.Random(seed)
    switched = []
    for request in requests:
        if not request.malformed and rng.random() < LORA_FRACTION:
            body = json.loads(request.body)
            if isinstance(body, dict):
                request = replace(request, body=json.dumps({**body, "model": rng.choice(RESIDENT)}))
        switched.append(request)
    return switched


def adapter_probes() -> list[SoakRequest]:
    """The soak's greedy probes asked of each resident adapter."""
    return [replace(probe, body=json.dumps({**json.loads(probe.body), "model": name}))
            for name in RESIDENT for probe in greedy_probes()[:2]]


async def churn(http: httpx.AsyncClient, state: LoRASoak, done: asyncio.Event) -> None:
    """Load, use, try to unload while busy, unload: until `done` is set (at least one cycle)."""
    body = {"model": CHURN, "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 16,
            "temperature": 0}
    while state.num_cycles == 0 or not done.is_set():
        loaded = await http.post("/v1/load_lora_adapter", json={"lora_name": CHURN,
                                                                 "lora_path": str(state.paths[CHURN])})
        if loaded.status_code != 200:
            state.note(f"load {CHURN}: {loaded.status_code} {loaded.text[:200]}")
            return
        answer = await http.post("/v1/chat/completions", json=body)
        state.answers.append(answer.json()["choices"][0]["message"]["content"] if answer.status_code == 200
                             else None)
        async with http.stream("POST", "/v1/chat/completions", json={**body, "max_tokens": 64, "ignore_eos": True,
                                                                     "stream": True}) as busy:
            lines = busy.aiter_lines()
            first = await anext(lines)  # the role chunk: the request is admitted and holds the adapter
            refused = await http.post("/v1/unload_lora_adapter", json={"lora_name": CHURN})
            if refused.status_code == 400:
                state.num_refused_in_use += 1
            else:
                state.note(f"unload while in use ({first[:60]!r}): {refused.status_code} {refused.text[:200]}")
            _ = [line async for line in lines]
        unloaded = await http.post("/v1/unload_lora_adapter", json={"lora_name": CHURN})
        if unloaded.status_code != 200:
            state.note(f"unload {CHURN}: {unloaded.status_code} {unloaded.text[:200]}")
            return
        state.num_cycles += 1


def lora_passed(state: LoRASoak, before: list[str | None], after: list[str | None]) -> bool:
    """Print the LoRA lines; True if every change answered as expected and every greedy answer held."""
    same_churn = len(set(state.answers)) == 1 and None not in state.answers
    same_resident = before == after and None not in before
    print(f"LoRA: {state.num_cycles} load/unload cycles ({state.num_refused_in_use} unloads refused while in use); "
          f"churned adapter's answers {'unchanged' if same_churn else 'CHANGED'}; resident adapters' greedy answers "
          f"{'unchanged' if same_resident else 'CHANGED'}")
    for problem in state.problems:
        print(f"  problem: {problem}")
    return same_churn and same_resident and not state.problems and state.num_cycles > 0
