"""The pooling math (reduce per chunk, then mean / last, L2-normalized, zero-safe), and `--pooling` from the command
line to the frozen engine config."""

import dataclasses
import math

import pytest
import torch

from radixlm.cli import build_parser, engine_kwargs
from radixlm.config import EngineConfig
from radixlm.core.step import ScheduledChunk
from radixlm.model.pooling import embedding_of, pool_chunks, reduce_chunk


def test_chunks_reduce_to_the_whole_prompts_mean_and_last_state():
    hidden = torch.randn(10, 8)
    sums = reduce_chunk(hidden[:4], "mean") + reduce_chunk(hidden[4:], "mean")
    mean = torch.tensor(embedding_of(sums, 10, "mean"))
    assert torch.allclose(mean, torch.nn.functional.normalize(hidden.mean(0), dim=0), atol=1e-6)
    last = torch.tensor(embedding_of(reduce_chunk(hidden[4:], "last"), 6, "last"))
    assert torch.allclose(last, hidden[-1] / hidden[-1].norm(), atol=1e-6)


def test_pool_chunks_finds_each_requests_rows_in_the_packed_batch():
    chunks = [ScheduledChunk("a", [1, 2, 3], 0, [], 0), ScheduledChunk("b", [4], 9, [], 1),
              ScheduledChunk("c", [5, 6], 0, [], 0, pools=True)]
    hidden = torch.arange(6 * 2, dtype=torch.float32).view(6, 2)
    pooled = pool_chunks(chunks, [0, 3, 4], hidden, {"a": "mean", "c": "last"})
    assert set(pooled) == {"a", "c"}
    assert pooled["a"].tolist() == hidden[:3].sum(0).tolist() and pooled["c"].tolist() == hidden[5].tolist()


def test_a_zero_vector_stays_zero_and_non_finite_states_are_refused():
    zeros = embedding_of(torch.zeros(4), 3, "mean")
    assert zeros == [0.0] * 4 and not any(math.isnan(x) for x in zeros)
    with pytest.raises(ValueError, match="not finite"):
        embedding_of(torch.tensor([1.0, float("nan")]), 1, "last")
    with pytest.raises(ValueError, match="unknown pooling type"):
        reduce_chunk(torch.zeros(2, 2), "max")


def test_pooling_is_an_engine_flag_validated_in_the_frozen_config(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    serve_help = capsys.readouterr().out
    assert "--pooling" in serve_help and "last" in serve_help and "mean" in serve_help
    args = build_parser().parse_args(["serve", "--pooling", "mean"])
    config = EngineConfig.from_kwargs(**engine_kwargs(args))
    assert config.model.pooling == "mean" and EngineConfig().model.pooling == "last"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.pooling = "last"  # type: ignore[misc]
    with pytest.raises(ValueError, match="pooling must be one of"):
        EngineConfig.from_kwargs(pooling="max")
