"""The grammar backend interface: compile a spec, track one request's progress, fill and apply token masks.

Everything above this interface (compile cache, sampler, engine) is backend-neutral; `XGrammarBackend` is the
implementation radixlm ships.
"""

from __future__ import annotations

from typing import Protocol

import torch

from radixlm.structured.grammar_spec import GrammarSpec


class GrammarMatcher(Protocol):
    """One request's position in its grammar."""

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar does not allow it."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens of this request into `bitmask[row]`."""

    def is_terminated(self) -> bool:
        """True once the grammar has accepted a stop token: the request must finish."""

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""


class GrammarBackend(Protocol):
    vocab_size: int

    def compile(self, spec: GrammarSpec) -> object:
        """Compile `spec`; raises ValueError naming the problem. Thread-safe, called off the engine's loop."""

    def memory_size(self, compiled: object) -> int:
        """The bytes a compiled grammar holds (what the compile cache's budget counts)."""

    def new_matcher(self, compiled: object) -> GrammarMatcher: ...

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """A bitmask with one row per logits row (row r masks logits row r)."""

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """For each r in `rows`, set the tokens `bitmask[r]` disallows in `logits[r]` to -inf, in place; other rows
        are untouched."""
