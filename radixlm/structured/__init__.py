"""Constrained decoding: grammars compiled off the hot path, token masks applied to constrained rows only."""
