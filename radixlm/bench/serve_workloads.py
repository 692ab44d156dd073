"""Workloads for `radixlm bench serve`: sessions of requests built from random tokens with a fixed seed.

A session is one conversation: its turns run one after another (a turn starts when the previous answer is
complete); sessions run concurrently. `random` and `shared-prefix` sessions are single completions of token-id
prompts with exact lengths; `multi-turn` sessions (`num_users` of them, `num_rounds` turns each) are chats whose
history (earlier questions and the model's real answers) grows every turn, so the chat template's prefix is shared
across turns as it is in real traffic. `grounded` sessions ask the model to repeat a passage of real text given in
the prompt (about 300 tokens from `data/public_domain.txt`): an input-grounded task, where speculative decoding's
n-gram drafts find their matches. `prefix-revisit` is `shared-prefix` with each prefix's questions spread over the
run (round-robin over the prefixes): a prefix comes back only after all the others have passed, which is what a
cache tier below device memory is for when the prefixes together exceed the KV cache (`--kv-offload-memory`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from radixlm.bench.workload import non_special_ids, random_requests

WORKLOADS = ("random", "shared-prefix", "prefix-revisit", "multi-turn", "grounded")
TEXT_PATH = Path(__file__).parent / "data" / "public_domain.txt"
PASSAGE_TOKENS = 300
QUESTIONS_PER_PREFIX = 8
DEFAULT_ROUNDS = 4
QUESTION_LEN = 32


@dataclass(frozen=True)
class Session:
    """`chat`: turns are user messages for /v1/chat/completions, else token-id prompts for /v1/completions."""

    turns: list[list[int]] | list[str]
    output_lens: list[int]
    chat: bool = False


@dataclass(frozen=True)
class WorkloadSpec:
    num_prompts: int  # requests in all, over every session
    input_len: tuple[int, int]
    output_len: tuple[int, int]
    prefix_len: int  # shared-prefix: tokens shared by each group of questions
    seed: int
    num_users: int | None = None  # multi-turn: conversations (default: num_prompts // num_rounds)
    num_rounds: int = DEFAULT_ROUNDS  # multi-turn: turns per conversation

    def __post_init__(self) -> None:
        if self.num_users is not None and self.num_users < 1:
            raise ValueError(f"num_users must be >= 1, got {self.num_users}")
        if self.num_rounds < 1:
            raise ValueError(f"num_rounds must be >= 1, got {self.num_rounds}")


def build_sessions(name: str, tokenizer: PreTrainedTokenizerBase, spec: WorkloadSpec) -> list[Session]:
    rng = random.Random(f"{name}-{spec.seed}")
    vocab = non_special_ids(tokenizer)

    def tokens(length: int) -> list[int]:
        return [rng.choice(vocab) for _ in range(length)]

    def output_len() -> int:
        return rng.randint(*spec.output_len)

    if name == "random":
        requests = random_requests(tokenizer, spec.num_prompts, spec.input_len, spec.output_len, spec.seed)
        return [Session([r.prompt_token_ids], [r.output_len]) for r in requests]
    if name in ("shared-prefix", "prefix-revisit"):
        groups = []
        for _ in range(max(1, spec.num_prompts // QUESTIONS_PER_PREFIX)):
            prefix = tokens(spec.prefix_len)
            groups.append([Session([prefix + tokens(QUESTION_LEN)], [output_len()])
                           for _ in range(QUESTIONS_PER_PREFIX)])
        if name == "prefix-revisit":  # question k of every prefix, then question k + 1 of every prefix, ...
            return [group[k] for k in range(QUESTIONS_PER_PREFIX) for group in groups]
        return [session for group in groups for session in group]
    if name == "multi-turn":
        sessions = []
        num_users = spec.num_users or max(1, spec.num_prompts // spec.num_rounds)
        for _ in range(num_users):
            first = tokenizer.decode(tokens(rng.randint(*spec.input_len)))
            follow_ups = [tokenizer.decode(tokens(QUESTION_LEN)) for _ in range(spec.num_rounds - 1)]
            sessions.append(Session([first, *follow_ups], [output_len() for _ in range(spec.num_rounds)],
                                    chat=True))
        return sessions
    if name == "grounded":
        return [Session([f"Repeat the following passage exactly, word for word.\n\n{passage}"], [output_len()],
                        chat=True) for passage in _passages(tokenizer, spec.num_prompts, rng)]
    raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")


def _passages(tokenizer: PreTrainedTokenizerBase, count: int, rng: random.Random) -> list[str]:
    """`count` passages of about PASSAGE_TOKENS tokens of the shipped text, each starting at a random paragraph and
    ending at the last sentence or paragraph end within its tokens (a passage that starts mid-sentence reads as a
    fragment to comment on, not a text to repeat)."""
    text = TEXT_PATH.read_text()
    starts = [0] + [index + 2 for index in range(len(text)) if text.startswith("\n\n", index)]
    passages = []
    for _ in range(count):
        token_ids = tokenizer.encode(text[rng.choice(starts):], add_special_tokens=False)[:PASSAGE_TOKENS]
        passage = tokenizer.decode(token_ids)
        end = max(passage.rfind(mark) + 1 for mark in (". ", ".\n", "? ", "! ", "\n\n"))  # a sentence or paragraph
        passages.append(passage[:end].rstrip() if end > len(passage) // 2 else passage)
    return passages
