"""Tokenizer work off the event loop, in fair turns, and the bound that refuses a text before it is tokenized.

Tokenizing, chat templating and detokenizing take time in proportion to the text (seconds for megabytes); on the
event loop they would stall every client, `/health` included. They run on two threads owned by the app, each
with its own copy of the tokenizer (a tokenizer object is not safe to use from two threads at once):

- the light lane takes jobs of at most `LIGHT_JOB_CHARS` characters, the heavy lane the others, so that a tiny
  request never waits behind a big one;
- each lane runs its shortest queued job first, so that within a lane a small job waits for at most the one
  already running. A job whose caller has gone (a client that disconnected) is skipped;
- the heavy lane runs at the lowest CPU priority (`background_threads.py`): a big job takes no core from the
  model's step.

The tokenizer releases the GIL while it encodes, so the lanes do run side by side (a tiny template + encode took
under 10 ms while a 660k-character encode ran on the other lane).

A text that can never fit the context is refused before it is tokenized at all: one token covers at most
`max_token_chars` characters of text (the longest token's text, special tokens included; for byte-level BPE a
token's string has one character per byte, and a character is at least one byte), so a text longer than
`max_model_len * max_token_chars` characters has more than `max_model_len` tokens. The bound is exact for
tokenizers without a normalizer (byte-level BPE: Llama 3, Qwen, SmolLM2); a normalizer may shorten text (Unicode
composition, stripping accents), so then it gets a 4x margin.
"""

from __future__ import annotations

import asyncio
import copy
import heapq
import itertools
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Concatenate, ParamSpec, TypeVar

from transformers import PreTrainedTokenizerBase

from radixlm.background_threads import lower_priority
from radixlm.server.errors import APIError

T = TypeVar("T")
P = ParamSpec("P")
NORMALIZER_MARGIN = 4
LIGHT_JOB_CHARS = 16_384  # ~13 ms of encoding on the default model's tokenizer


def max_token_chars(tokenizer: PreTrainedTokenizerBase) -> int:
    """An upper bound on the characters of text one token can stand for (see the module docstring)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    longest = max((len(token) for token in tokens if token), default=1)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    normalizer = getattr(backend, "normalizer", "unknown") if backend is not None else "unknown"
    return longest if normalizer is None else longest * NORMALIZER_MARGIN


class _Lane:
    """One thread running queued jobs shortest first, on its own copies of the tokenizers it is given."""

    def __init__(self, name: str, low_priority: bool = False) -> None:
        self._low_priority = low_priority
        self._jobs: list[tuple[int, int, Callable[[], None]]] = []  # (size, arrival, run) heap
        self._arrivals = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._copies: dict[int, PreTrainedTokenizerBase] = {}  # id(the app's tokenizer) -> this lane's copy
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, size: int, run: Callable[[], None]) -> None:
        with self._ready:
            heapq.heappush(self._jobs, (size, next(self._arrivals), run))
            self._ready.notify()

    def own_copy(self, tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
        """This lane's copy of `tokenizer` (lane thread only). The app keeps one tokenizer, so this holds one."""
        key = id(tokenizer)
        if key not in self._copies:
            self._copies[key] = copy.deepcopy(tokenizer)
        return self._copies[key]

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._jobs.clear()
            self._ready.notify()

    def _work(self) -> None:
        if self._low_priority:
            lower_priority()
        while True:
            with self._ready:
                while not self._jobs and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                _, _, run = heapq.heappop(self._jobs)
            run()


class Tokenization:
    """The app's tokenizer lanes: `await run(tokenizer, num_chars, fn, *args)` runs `fn(copy, *args)` on a lane
    thread, `copy` being that lane's copy of `tokenizer`; `num_chars` (the size of the text it works on) picks the
    lane and the turn."""

    def __init__(self) -> None:
        self._light = _Lane("radixlm-tokenizer")
        self._heavy = _Lane("radixlm-tokenizer-heavy", low_priority=True)
        self._max_chars: dict[int, int] = {}  # id(tokenizer) -> max_token_chars (the app keeps one tokenizer)

    async def run(self, tokenizer: PreTrainedTokenizerBase, num_chars: int,
                  fn: Callable[Concatenate[PreTrainedTokenizerBase, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        result: asyncio.Future[T] = loop.create_future()
        lane = self._light if num_chars <= LIGHT_JOB_CHARS else self._heavy
        job = partial(_run_job, loop, result, lane, tokenizer, partial(fn, **kwargs), args)
        lane.submit(num_chars, job)
        return await result

    async def check_can_fit(self, tokenizer: PreTrainedTokenizerBase, num_chars: int, max_model_len: int,
                            param: str) -> None:
        """400 `context_length_exceeded` when `num_chars` of text must be more than `max_model_len` tokens."""
        key = id(tokenizer)
        if key not in self._max_chars:
            self._max_chars[key] = await self.run(tokenizer, 0, max_token_chars)
        limit = max_model_len * self._max_chars[key]
        if num_chars > limit:
            raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, {param} "
                                f"has {num_chars} characters, more than that many tokens can hold (at most {limit} "
                                f"characters); it was not tokenized. Please reduce the length of {param}.",
                           param=param, code="context_length_exceeded")

    def shutdown(self) -> None:
        self._light.close()
        self._heavy.close()


def _run_job(loop: asyncio.AbstractEventLoop, result: asyncio.Future[Any], lane: _Lane,
             tokenizer: PreTrainedTokenizerBase, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """On the lane's thread: `fn(lane's copy, *args)` into `result`, unless its caller has gone."""
    if result.done():  # cancelled: the client left while it waited
        return
    try:
        value = fn(lane.own_copy(tokenizer), *args)
    except BaseException as error:  # the caller's to handle, as run_in_executor would deliver it
        loop.call_soon_threadsafe(_settle, result, None, error)
    else:
        loop.call_soon_threadsafe(_settle, result, value, None)


def _settle(result: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if result.done():
        return
    if error is not None:
        result.set_exception(error)
    else:
        result.set_result(value)


def num_text_chars(value: Any) -> int:
    """The characters of every string in `value` (dict keys and values, list items, nested): what a chat template
    is given to render. Iterative, so any nesting is safe."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total
