"""Random workloads with a fixed seed: prompts of random token ids with lengths drawn from ranges."""

from __future__ import annotations

import random
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


MAX_LENGTH = 1 << 20  # tokens: a length past any model's context, before it is built


def parse_range(text: str) -> tuple[int, int]:
    """'64-512' -> (64, 512); '128' -> (128, 128)."""
    low, _, high = text.partition("-")
    bounds = (int(low), int(high or low))
    if bounds[0] < 1 or bounds[0] > bounds[1] or bounds[1] > MAX_LENGTH:
        raise ValueError(f"bad length range {text!r}: want LOW-HIGH with 1 <= LOW <= HIGH <= {MAX_LENGTH}")
    return bounds


def random_requests(tokenizer: PreTrainedTokenizerBase, num_prompts: int, input_len: tuple[int, int],
                    output_len: tuple[int, int], seed: int) -> list[BenchRequest]:
    """Prompts of uniformly random non-special token ids; lengths uniform within the ranges."""
    rng = random.Random(seed)
    vocab = non_special_ids(tokenizer)
    return [BenchRequest([rng.choice(vocab) for _ in range(rng.randint(*input_len))], rng.randint(*output_len))
            for _ in range(num_prompts)]


def non_special_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every token id of the tokenizer except its special ones: what random prompts are drawn from."""
    special = set(tokenizer.all_special_ids)
    return [token_id for token_id in range(len(tokenizer)) if token_id not in special]
