"""Incremental detokenization: text grows token by token without re-decoding the whole sequence."""

from __future__ import annotations

from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase

# Prompt tokens fed to the stream first, so that the first output token decodes with its real leading space.
_PROMPT_CONTEXT_TOKENS = 4


class IncrementalDetokenizer:
    """Wraps the tokenizers library's DecodeStream; `add` returns the text each new token completes.

    Bytes of a multi-byte character split over several tokens are held back until the character is whole; `flush`
    gives what is still held back when the sequence ends (as replacement characters, like a full decode does).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._context = prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:]
        self._stream = DecodeStream(ids=self._context, skip_special_tokens=skip_special_tokens)
        self._held: list[int] = []  # tokens added since the last one that produced text

    def add(self, token_id: int) -> str:
        piece = self._stream.step(self._backend, token_id) or ""
        if piece:
            self._context = (self._context + self._held + [token_id])[-_PROMPT_CONTEXT_TOKENS:]
            self._held = []
        else:
            self._held.append(token_id)
        return piece

    def flush(self) -> str:
        """The text of the held-back tokens, decoded as they are (an incomplete character becomes U+FFFD)."""
        if not self._held:
            return ""
        before = self._tokenizer.decode(self._context, skip_special_tokens=self._skip_special_tokens)
        after = self._tokenizer.decode(self._context + self._held, skip_special_tokens=self._skip_special_tokens)
        self._held = []
        return after[len(before):] if after.startswith(before) else ""
