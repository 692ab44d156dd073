"""Engine logprobs (one `{token_id: Logprob}` per position) in OpenAI's chat and completions shapes."""

from __future__ import annotations

import math
import re
from functools import cache, cached_property

from transformers import PreTrainedTokenizerBase

from radixlm.outputs import Logprob, PositionLogprobs
from radixlm.server.response_bodies import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

_MIN_LOGPROB = -9999.0  # JSON has no -inf; OpenAI and vLLM clamp the same way


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte-fallback tokens


def _finite(value: float) -> float:
    return value if math.isfinite(value) else _MIN_LOGPROB


@cache
def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table: printable Latin-1 bytes stand for
    themselves, the others for code points from 256 on, in byte order) -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


class OpenAILogprobs:
    """Engine logprobs -> OpenAI objects; token text comes from the engine (`decoded_token`) or the tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    # Built on the first `token_bytes` call: every request makes a formatter, few ask for chat logprobs, and the
    # special ids cost ~0.25 ms on the event loop.
    @cached_property
    def _byte_alphabet(self) -> dict[str, int] | None:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        return _byte_level_alphabet() if type(getattr(backend, "decoder", None)).__name__ == "ByteLevel" else None

    @cached_property
    def _special_ids(self) -> set[int]:
        return set(self.tokenizer.all_special_ids) | set(getattr(self.tokenizer, "added_tokens_decoder", {}))

    def token_bytes(self, token_id: int, text: str) -> list[int]:
        """The token's own bytes (OpenAI's `bytes`): a token holding part of a UTF-8 character decodes to U+FFFD
        alone, so its text cannot say which byte it is. `text` (its decoded text) serves special tokens and
        tokenizers whose pieces are not byte-level."""
        if token_id not in self._special_ids:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str):
                if self._byte_alphabet is not None and piece and all(ch in self._byte_alphabet for ch in piece):
                    return [self._byte_alphabet[ch] for ch in piece]
                match = _BYTE_PIECE.fullmatch(piece)
                if match:
                    return [int(match.group(1), 16)]
        return list(text.encode())

    def token_text(self, token_id: int, logprob: Logprob | None) -> str:
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        return self.tokenizer.decode([token_id])

    def _ranked(self, position: PositionLogprobs) -> list[tuple[int, Logprob]]:
        return sorted(position.items(), key=lambda item: -item[1].logprob)

    def chat(self, token_ids: list[int], positions: list[PositionLogprobs], top_n: int) -> ChatLogprobs:
        content = []
        for token_id, position in zip(token_ids, positions, strict=False):
            chosen = position.get(token_id)
            text = self.token_text(token_id, chosen)
            top = [TopLogprob(token=(t := self.token_text(alt_id, alt)), logprob=_finite(alt.logprob),
                              bytes=self.token_bytes(alt_id, t))
                   for alt_id, alt in self._ranked(position)[:top_n]]
            content.append(ChatTokenLogprob(token=text, logprob=_finite(chosen.logprob if chosen else -math.inf),
                                            bytes=self.token_bytes(token_id, text), top_logprobs=top))
        return ChatLogprobs(content=content)

    def completion(self, token_ids: list[int], positions: list[PositionLogprobs | None], top_n: int,
                   text_offset: int) -> CompletionLogprobs:
        """Positions may be None (the first prompt token has no logprob); offsets start at `text_offset`."""
        result = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for token_id, position in zip(token_ids, positions, strict=False):
            chosen = position.get(token_id) if position else None
            text = self.token_text(token_id, chosen)
            result.tokens.append(text)
            result.text_offset.append(text_offset)
            text_offset += len(text)
            if position is None:
                result.token_logprobs.append(None)
                result.top_logprobs.append(None)
                continue
            result.token_logprobs.append(_finite(chosen.logprob) if chosen else None)
            top: dict[str, float] = {}
            for alt_id, alt in self._ranked(position)[:top_n]:  # most likely first: it keeps a shared text key
                top.setdefault(self.token_text(alt_id, alt), _finite(alt.logprob))
            if chosen is not None:
                top.setdefault(text, _finite(chosen.logprob))
            result.top_logprobs.append(top)
        return result
