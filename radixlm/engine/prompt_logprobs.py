"""Prompt logprobs: which prompt positions need logits this step, and recording their logprobs on the group."""

from __future__ import annotations

import logging

from radixlm.core.step import SchedulerOutput, TokenLogprobs
from radixlm.engine.logprob_format import LogprobFormatter
from radixlm.engine.sequence_group import Sequence, SequenceGroup

logger = logging.getLogger(__name__)

SequenceIndex = dict[str, tuple[SequenceGroup, Sequence]]  # scheduler request id -> its group and sequence


def prompt_logits_positions(scheduler_output: SchedulerOutput, sequences: SequenceIndex) -> dict[str, tuple[int, int]]:
    """Positions `(first, end)` per request whose logits give prompt logprobs not computed yet (prompt token j comes
    from position j - 1). A recomputed (preempted) prompt skips the positions already done, so none is reported
    twice."""
    positions = {}
    for chunk in scheduler_output.chunks:
        group, sequence = sequences[chunk.request_id]
        if sequence.index != 0 or group.prompt_logprobs_done:
            continue
        assert group.prompt_logprobs is not None
        first = len(group.prompt_logprobs) - 1
        if chunk.start_position > first:  # positions reused from the prefix cache have no logits
            logger.warning("request %s: prompt positions %d..%d came from the prefix cache; their prompt "
                           "logprobs are None", group.request_id, first, chunk.start_position - 1)
            group.prompt_logprobs += [None] * (chunk.start_position - first)
            first = chunk.start_position
        end = min(chunk.context_len, len(group.prompt_token_ids) - 1)
        if first < end:
            positions[chunk.request_id] = (first, end)
    return positions


def record_prompt_logprobs(group: SequenceGroup, entries: list[TokenLogprobs], formatter: LogprobFormatter) -> None:
    """Append the logprobs of the prompt positions computed this step (the worker's `entries`) to the group's
    `prompt_logprobs`."""
    assert group.prompt_logprobs is not None and group.params.prompt_logprobs is not None
    group.prompt_logprobs += [formatter.position(entry) for entry in entries]
