"""Per-sequence random streams with no generator objects: uniform number `t` of a stream is hash(key, t).

Why counter-based: a sequence samples exactly one uniform per generated token, and its counter is the number of
tokens it has generated so far. So its stream cannot depend on which rows share the batch, on its row, on how its
prompt was chunked, or on preemption (a resumed sequence keeps its tokens, so its counter continues where it was);
there is no generator state to save, copy when forking, or ship to another process; and the uniforms of a whole
batch come from a few dozen element-wise tensor ops instead of one generator call per row.

A stream's key is splitmix64 of its seed (in Python, once per sequence), so nearby seeds (`seed + i` of n > 1)
get unrelated keys. Per step, the counter goes through Chris Wellons' `lowbias32` integer hash keyed by both
32-bit halves of the key. The hash runs on 32-bit values held in int64 tensors: each multiplier is taken modulo
2**32 into (-2**31, 2**31), so no product leaves int64, and masking keeps the low 32 bits.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_MASK64 = 2**64 - 1


def _signed(multiplier: int) -> int:
    """The same multiplier modulo 2**32, in (-2**31, 2**31): products with 32-bit values fit in int64."""
    return multiplier - 2**32 if multiplier >= 2**31 else multiplier


_MUL_1 = _signed(0x7FEB352D)
_MUL_2 = _signed(0x846CA68B)
_SALT = 0x9E3779B9  # separates the second output word from the first


def _mix(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on values in [0, 2**32) held in int64."""
    x = x ^ (x >> 16)
    x = (x * _MUL_1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL_2) & _MASK32
    return x ^ (x >> 16)


def splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def stream_key(seed: int) -> tuple[int, int]:
    """The key of the stream of `seed` (any integer; taken modulo 2**64) as two 32-bit halves (low, high)."""
    key = splitmix64(seed & _MASK64)
    return key & _MASK32, key >> 32


def stream_uniforms(key_lows: torch.Tensor, key_highs: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Uniform float64 numbers in [0, 1), one per row: number `counters[i]` of the stream of key i.

    All arguments are int64 tensors of one shape; keys come from `stream_key`, counters are in [0, 2**32).
    53 random bits per number, like `random.random()`.
    """
    high = _mix(_mix(counters ^ key_lows) ^ key_highs)
    low = _mix(high ^ key_lows ^ _SALT)
    return ((high << 21) | (low >> 11)).double() * 2.0**-53


def mix_seed(engine_seed: int, sequence_number: int) -> int:
    """The seed of an unseeded request: a 64-bit mix of the engine seed and its arrival number.

    Runs with the same engine seed and the same order of requests draw the same tokens.
    """
    return splitmix64((splitmix64(engine_seed & _MASK64) + sequence_number) & _MASK64)
