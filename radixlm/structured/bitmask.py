"""GrammarBitmask: the allowed next tokens of a step's constrained rows, sent to the worker beside the step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GrammarBitmask:
    """Row i of `bitmask` (int32 words, bit j of word w is token 32 * w + j, set when allowed; a torch tensor) is
    the mask of sampling row `row_offsets[i]` of `request_ids[i]` (0: its first; j: after its first j drafts).
    Rows without a mask are not constrained. Built by the engine's grammar tracker, applied by the sampler."""

    request_ids: list[str]
    bitmask: Any
    row_offsets: list[int]
