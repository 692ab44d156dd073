"""LogprobFormatter: the worker's raw `TokenLogprobs` as the outputs' `{token_id: Logprob}`
dictionaries (the prompt positions whose logprobs each step computes are the scheduler's: `core/sequence_groups.py`).

(The worker computes them: `radixlm/sample/logprobs.py`; the server shapes them for OpenAI:
`server/openai_logprobs.py`.)
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from radixlm.core.step import TokenLogprobs
from radixlm.outputs import Logprob, PositionLogprobs


class LogprobFormatter:
    """Decodes each token id once (a token's text alone, as OpenAI's `tokens` show it) and caches the text."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id]) if token_id < len(self._tokenizer) else ""
            self._texts[token_id] = text
        return text

    def position(self, entry: TokenLogprobs) -> PositionLogprobs:
        """The chosen token first, then the alternatives most likely first (the chosen one is not repeated)."""
        position = {entry.token_id: Logprob(entry.logprob, entry.rank, self.token_text(entry.token_id))}
        for rank, (token_id, logprob) in enumerate(zip(entry.top_token_ids, entry.top_logprobs, strict=True), 1):
            if token_id not in position:
                position[token_id] = Logprob(logprob, rank, self.token_text(token_id))
        return position
