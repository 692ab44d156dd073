"""Engine logprobs (one `{token_id: Logprob}` per position) in OpenAI's chat and completions shapes."""

from __future__ import annotations

import math

from transformers import PreTrainedTokenizerBase

from radixlm.engine.outputs import Logprob, PositionLogprobs
from radixlm.server.responses import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

_MIN_LOGPROB = -9999.0  # JSON has no -inf; OpenAI and vLLM clamp the same way


def _finite(value: float) -> float:
    return value if math.isfinite(value) else _MIN_LOGPROB


class OpenAILogprobs:
    """Engine logprobs -> OpenAI objects; token text comes from the engine (`decoded_token`) or the tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

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
                              bytes=list(t.encode()))
                   for alt_id, alt in self._ranked(position)[:top_n]]
            content.append(ChatTokenLogprob(token=text, logprob=_finite(chosen.logprob if chosen else -math.inf),
                                            bytes=list(text.encode()), top_logprobs=top))
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
