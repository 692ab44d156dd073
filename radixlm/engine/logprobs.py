"""The engine's side of logprobs: the worker's raw `TokenLogprobs` as the outputs' `{token_id: Logprob}`
dictionaries, and the prompt positions whose logprobs each step must compute.

(The worker computes them: `radixlm/sample/logprobs.py`; the server shapes them for OpenAI: `server/logprobs.py`.)
"""

from __future__ import annotations

import logging

from transformers import PreTrainedTokenizerBase

from radixlm.core.step import SchedulerOutput, TokenLogprobs
from radixlm.engine.outputs import Logprob, PositionLogprobs
from radixlm.engine.parent_request import ParentRequest, RequestState

logger = logging.getLogger(__name__)


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


StateIndex = dict[str, tuple[ParentRequest, RequestState]]  # child request id -> its parent and state


def prompt_logits_positions(scheduler_output: SchedulerOutput, children: StateIndex) -> dict[str, tuple[int, int]]:
    """Positions `(first, end)` per request whose logits give prompt logprobs not computed yet (prompt token j comes
    from position j - 1). A recomputed (preempted) prompt skips the positions already done, so none is reported
    twice."""
    positions = {}
    for chunk in scheduler_output.chunks:
        parent, state = children[chunk.request_id]
        if state.index != 0 or parent.prompt_logprobs_done:
            continue
        assert parent.prompt_logprobs is not None
        first = len(parent.prompt_logprobs) - 1
        if chunk.start_position > first:  # positions reused from the prefix cache have no logits
            logger.warning("request %s: prompt positions %d..%d came from the prefix cache; their prompt "
                           "logprobs are None", parent.request_id, first, chunk.start_position - 1)
            parent.prompt_logprobs += [None] * (chunk.start_position - first)
            first = chunk.start_position
        end = min(chunk.context_len, len(parent.prompt_token_ids) - 1)
        if first < end:
            positions[chunk.request_id] = (first, end)
    return positions


def record_prompt_logprobs(parent: ParentRequest, entries: list[TokenLogprobs], formatter: LogprobFormatter) -> None:
    """Append the logprobs of the prompt positions computed this step (the worker's `entries`) to the parent's
    `prompt_logprobs`."""
    assert parent.prompt_logprobs is not None and parent.params.prompt_logprobs is not None
    parent.prompt_logprobs += [formatter.position(entry) for entry in entries]
