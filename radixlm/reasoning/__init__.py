"""Reasoning parsers (`--reasoning-parser`): split a model's thinking text from its answer."""

from __future__ import annotations

from radixlm.reasoning.think import (
    REASONING_PARSERS,
    THINK_END,
    THINK_START,
    ReasoningParser,
    ReasoningStream,
    get_reasoning_parser,
)

__all__ = ["REASONING_PARSERS", "THINK_END", "THINK_START", "ReasoningParser", "ReasoningStream",
           "get_reasoning_parser"]
