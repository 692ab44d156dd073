"""The `<think>...</think>` reasoning parsers: `deepseek_r1` and `qwen3` (as vLLM and SGLang name them).

Both split `<think>...</think>` from the answer. They differ when the text has no `</think>`: DeepSeek-R1's
template opens the think block in the prompt, so unclosed text is all reasoning; Qwen3 may answer without
thinking, so text without `</think>` is all content.

Free text is split at its first `</think>`. Under a grammar (`server/tool_calling.after_reasoning`) the split
follows the grammar's structure instead, so that an answer holding `</think>` (a JSON string, a call's argument)
is never cut: the grammar's think block ends at its first `</think>` (deepseek_r1: the first is the split), and
for qwen3 the output is either the answer alone or a block opened by `<think>` at its very start
(`think_must_open`: without that opening, the whole output is the answer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from radixlm.tool_parsers.base import held_back

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    """`unclosed_is_reasoning`: whether text without `</think>` is reasoning (deepseek_r1) or content (qwen3).
    `think_must_open`: reasoning only when the text starts with `<think>` (see the module docstring)."""

    name: str
    unclosed_is_reasoning: bool
    think_must_open: bool = False

    def under_grammar(self) -> ReasoningParser:
        """This parser for output a grammar shaped by `after_reasoning`."""
        return self if self.unclosed_is_reasoning else replace(self, think_must_open=True)

    def parse(self, text: str) -> tuple[str | None, str | None]:
        """Non-streaming: (reasoning_content, content) -- what a stream of the same text yields."""
        stream = ReasoningStream(self)
        reasoning, content = stream.feed(text, final=True)
        return reasoning or None, content or None


REASONING_PARSERS = {"deepseek_r1": ReasoningParser("deepseek_r1", unclosed_is_reasoning=True),
                     "qwen3": ReasoningParser("qwen3", unclosed_is_reasoning=False)}


def get_reasoning_parser(name: str) -> ReasoningParser:
    if name not in REASONING_PARSERS:
        raise ValueError(f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}, got {name!r}")
    return REASONING_PARSERS[name]


class ReasoningStream:
    """Feed text deltas, get (reasoning delta, content delta) pairs.

    qwen3 cannot tell reasoning from content until `</think>` arrives, so it holds the text back until then (or
    the end, when it is all content); deepseek_r1 streams reasoning as it comes.
    """

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self._buffer = ""
        self._in_reasoning = True
        self._started = False
        self._content_started = False

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        reasoning, content = self._feed(delta, final)
        if not self._content_started:  # the blank line after </think> is markup too
            content = content.lstrip("\n")
            self._content_started = bool(content)
        return reasoning, content

    def _feed(self, delta: str, final: bool) -> tuple[str, str]:
        if not self._in_reasoning:
            return "", delta
        self._buffer += delta
        if not self._started and self.parser.think_must_open and not self._buffer.startswith(THINK_START):
            if not final and THINK_START.startswith(self._buffer):
                return "", ""
            text, self._buffer, self._in_reasoning = self._buffer, "", False  # no think block: all answer
            return "", text
        if not self._started:  # a leading <think> (and the blank after it) is markup, not reasoning
            stripped = self._buffer.lstrip()
            opened_only = stripped.startswith(THINK_START) and not stripped[len(THINK_START):].strip("\n")
            if not final and (THINK_START.startswith(stripped) or opened_only):
                return "", ""
            self._buffer = stripped.removeprefix(THINK_START).lstrip("\n") if stripped.startswith(THINK_START) \
                else self._buffer
            self._started = True
        end = self._buffer.find(THINK_END)
        if end != -1:
            reasoning, content = self._buffer[:end], self._buffer[end + len(THINK_END):]
            self._buffer, self._in_reasoning = "", False
            return reasoning, content
        if final:
            text, self._buffer = self._buffer, ""
            return (text, "") if self.parser.unclosed_is_reasoning else ("", text)
        if not self.parser.unclosed_is_reasoning:
            return "", ""
        keep = held_back(self._buffer, THINK_END)
        text, self._buffer = self._buffer[:len(self._buffer) - keep], self._buffer[len(self._buffer) - keep:]
        return text, ""
