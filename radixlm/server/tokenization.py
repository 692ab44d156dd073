"""Tokenizer work off the event loop, and the bound that refuses a text before it is tokenized.

Tokenizing, chat templating and detokenizing take time in proportion to the text (seconds for megabytes); on the
event loop they would stall every client, `/health` included. They run on one thread owned by the app (one,
because a tokenizer object is not safe to use from two threads at once).

Off the loop is not enough for huge texts: the tokenizer holds the GIL for part of its work (a 12 MB encode
stalled the loop for ~1.5 s at a time from a worker thread). So a text that can never fit the context is refused
before it is tokenized: one token covers at most `max_token_chars` characters of text (the longest token's text,
special tokens included; for byte-level BPE a token's string has one character per byte, and a character is at
least one byte), so a text longer than `max_model_len * max_token_chars` characters has more than `max_model_len`
tokens. The bound is exact for tokenizers without a normalizer (byte-level BPE: Llama 3, Qwen, SmolLM2); a
normalizer may shorten text (Unicode composition, stripping accents), so then it gets a 4x margin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from transformers import PreTrainedTokenizerBase

from radixlm.server.errors import APIError

T = TypeVar("T")
NORMALIZER_MARGIN = 4


def max_token_chars(tokenizer: PreTrainedTokenizerBase) -> int:
    """An upper bound on the characters of text one token can stand for (see the module docstring)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    longest = max((len(token) for token in tokens if token), default=1)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    normalizer = getattr(backend, "normalizer", "unknown") if backend is not None else "unknown"
    return longest if normalizer is None else longest * NORMALIZER_MARGIN


class Tokenization:
    """The app's tokenizer thread: `await run(fn, *args)` runs `fn(*args)` there."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixlm-tokenizer")
        self._max_chars: dict[int, int] = {}  # id(tokenizer) -> max_token_chars (the app keeps one tokenizer)

    async def run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args, **kwargs))

    async def check_can_fit(self, tokenizer: PreTrainedTokenizerBase, num_chars: int, max_model_len: int,
                            param: str) -> None:
        """400 `context_length_exceeded` when `num_chars` of text must be more than `max_model_len` tokens."""
        key = id(tokenizer)
        if key not in self._max_chars:
            self._max_chars[key] = await self.run(max_token_chars, tokenizer)
        limit = max_model_len * self._max_chars[key]
        if num_chars > limit:
            raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, {param} "
                                f"has {num_chars} characters, more than that many tokens can hold (at most {limit} "
                                f"characters); it was not tokenized. Please reduce the length of {param}.",
                           param=param, code="context_length_exceeded")

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
