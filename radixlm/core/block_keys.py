"""Content keys of full KV blocks: a name for what a block holds, whichever tier holds it.

Block i of a token sequence covers positions `[i * block_size, (i + 1) * block_size)`. Its key hashes the key of
block i - 1 with the block's own tokens, so it names the whole prefix up to the block's end: equal keys mean equal
K/V (under one model and one namespace, which start the chain). blake2b rather than Python's `hash`, so that keys
are the same in every process and across restarts. Pure Python, no torch.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

KEY_BYTES = 16


def chain_start(namespace: int, salt: bytes = b"") -> bytes:
    """The key before block 0: of `namespace` (a LoRA adapter's id, 0 for the base model) under `salt` (the model's
    identity, for keys that outlive this process; empty for keys that do not)."""
    return hashlib.blake2b(salt + namespace.to_bytes(8, "little", signed=True), digest_size=KEY_BYTES).digest()


def block_keys(token_ids: Sequence[int], block_size: int, namespace: int = 0, salt: bytes = b"",
               num_blocks: int | None = None) -> list[bytes]:
    """The keys of the first `num_blocks` full blocks of `token_ids` (all of them when None)."""
    count = len(token_ids) // block_size
    if num_blocks is not None:
        count = min(count, num_blocks)
    previous = chain_start(namespace, salt)
    keys = []
    for index in range(count):
        digest = hashlib.blake2b(previous, digest_size=KEY_BYTES)
        digest.update(array("q", token_ids[index * block_size:(index + 1) * block_size]).tobytes())
        previous = digest.digest()
        keys.append(previous)
    return keys
