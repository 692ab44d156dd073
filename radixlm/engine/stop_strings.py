"""Stop strings on incrementally growing text: where one completes, and what streaming must still hold back.

A stop string can span token boundaries, so matching runs on the text, not on tokens. The match reported is the
one that completes first, as if the text had arrived one character at a time (earliest end; on a tie the longer
string): the result then depends on the text alone, never on how it was split into tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    stop: str
    start: int  # index of its first character in the text

    @property
    def end(self) -> int:
        return self.start + len(self.stop)


def find_stop(text: str, num_new_chars: int, stops: Sequence[str]) -> StopMatch | None:
    """The first-completing occurrence of a stop string that ends in the last `num_new_chars` characters.

    Occurrences wholly inside the older text were looked for when that text arrived, so they are not searched.
    """
    best: StopMatch | None = None
    for stop in stops:
        start = text.find(stop, max(0, len(text) - num_new_chars - len(stop) + 1))
        if start < 0:
            continue
        match = StopMatch(stop, start)
        if best is None or (match.end, match.start) < (best.end, best.start):
            best = match
    return best


def held_back_length(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of `text` that is a proper prefix of a stop string (it may yet become one)."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[len(text) - length:]):
                longest = length
                break
    return longest
