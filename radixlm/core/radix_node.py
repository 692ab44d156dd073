"""The radix tree's node (`RadixNode`), a lookup's result (`PrefixMatch`), and the edge comparison
(`common_prefix_len`); the tree itself is `radixlm.core.radix_cache.RadixCache`. Pure Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass


class RadixNode:
    __slots__ = ("block_ids", "children", "last_access", "lock_ref", "parent", "start", "token_ids")

    def __init__(self, token_ids: list[int], start: int, block_ids: list[int], parent: RadixNode | None) -> None:
        self.token_ids = token_ids
        self.start = start
        self.block_ids = block_ids
        self.parent = parent
        self.children: dict[int, RadixNode] = {}
        self.lock_ref = 0
        self.last_access = 0

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)

    def __repr__(self) -> str:
        return f"RadixNode([{self.start}, {self.end}), blocks={self.block_ids}, lock={self.lock_ref})"


@dataclass
class PrefixMatch:
    """`num_tokens` matched; `block_ids` cover positions `0 .. num_tokens - 1` (the last may be partly used)."""

    num_tokens: int
    block_ids: list[int]
    node: RadixNode


def common_prefix_len(a: list[int], b: list[int], offset: int = 0) -> int:
    """Length of the common prefix of `a` and `b[offset:]`."""
    limit = min(len(a), len(b) - offset)
    if a[:limit] == b[offset:offset + limit]:  # the usual case (a whole edge matches), compared in C
        return limit
    for i in range(limit):
        if a[i] != b[offset + i]:
            return i
    return limit
