"""Incremental detokenization: text grows token by token without re-decoding the whole sequence."""

from __future__ import annotations

from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase

# Prompt tokens fed to the stream first, so that the first output token decodes with its real leading space.
_PROMPT_CONTEXT_TOKENS = 4


class IncrementalDetokenizer:
    """Wraps the tokenizers library's DecodeStream; `add` returns the text each new token completes.

    Bytes of a multi-byte character split over several tokens are held back until the character is whole.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True) -> None:
        self._backend = tokenizer.backend_tokenizer
        self._stream = DecodeStream(ids=prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:],
                                    skip_special_tokens=skip_special_tokens)
        self.text = ""

    def add(self, token_id: int) -> str:
        piece = self._stream.step(self._backend, token_id) or ""
        self.text += piece
        return piece
