"""Pooling for embedding requests: the model's final hidden states, reduced chunk by chunk, then one vector.

The final hidden states are HF's `last_hidden_state` of the base model (after the final norm), the rows the LM head
would read. The causal LM computes them for every position of the packed batch anyway and keeps only the rows it
needs logits of, so a forward hook on the decoder captures them at no extra cost, and only in steps with pooling.

Per chunk of a pooling request the runner reduces its rows (`reduce_chunk`): the last row ("last"), or their
float32 sum ("mean", added to the request's running sum by the worker across chunked-prefill steps). When the
prompt is complete, `embedding_of` makes the vector: the mean (sum / positions) or last state, L2-normalized.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from radixlm.core.step import ScheduledChunk

# F.normalize divides by max(norm, eps): a zero vector stays zero, never 0 / 0.
_NORM_EPS = 1e-12


@contextmanager
def final_hidden_states(model: PreTrainedModel, capture: bool) -> Iterator[list[torch.Tensor]]:
    """While active (and `capture`), each forward of `model` appends its `last_hidden_state` ([1, T, H]) to the
    yielded list. With `capture` false nothing is hooked."""
    captured: list[torch.Tensor] = []
    if not capture:
        yield captured
        return

    decoder = model.get_decoder()
    if decoder is model:  # no base model inside: its output would be the logits, not the hidden states
        raise ValueError(f"{type(model).__name__} has no decoder module to read final hidden states from")

    def keep(_module: torch.nn.Module, _args: Any, output: Any) -> None:
        captured.append(output.last_hidden_state)

    handle = decoder.register_forward_hook(keep)
    try:
        yield captured
    finally:
        handle.remove()


def reduce_chunk(hidden: torch.Tensor, pooling_type: str) -> torch.Tensor:
    """One chunk's rows `[num_tokens, H]` -> `[H]` float32 on the host: the last row, or the sum of the rows."""
    if pooling_type == "last":
        return hidden[-1].float().cpu()
    if pooling_type == "mean":
        return hidden.float().sum(dim=0).cpu()
    raise ValueError(f"unknown pooling type {pooling_type!r}")


def pool_chunks(chunks: Sequence[ScheduledChunk], first_rows: Sequence[int], hidden: torch.Tensor,
                pooling_types: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """`reduce_chunk` of each chunk whose request is in `pooling_types` (request id -> "last" / "mean"); `hidden` is
    the packed batch's `[T, H]`, where chunk i starts at row `first_rows[i]`."""
    reduced: dict[str, torch.Tensor] = {}
    for chunk, row in zip(chunks, first_rows, strict=True):
        pooling_type = pooling_types.get(chunk.request_id)
        if pooling_type is not None:
            reduced[chunk.request_id] = reduce_chunk(hidden[row:row + chunk.num_tokens], pooling_type)
    return reduced


def embedding_of(pooled: torch.Tensor, num_positions: int, pooling_type: str) -> list[float]:
    """The request's vector from its pooled state (the last position's, or the sum over `num_positions`):
    L2-normalized float32 values as Python floats. ValueError when the model produced NaN or infinity (the
    request fails alone: such a vector means nothing and has no JSON form)."""
    vector = pooled / num_positions if pooling_type == "mean" else pooled
    if not bool(torch.isfinite(vector).all()):
        raise ValueError("the model's hidden states are not finite (NaN or infinity)")
    return F.normalize(vector.float(), dim=-1, eps=_NORM_EPS).tolist()
