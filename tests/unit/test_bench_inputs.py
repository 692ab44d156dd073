"""`bench peers` cases and length ranges refuse hostile values with a ValueError naming them, before any server
starts."""

import pytest
import torch

from radixlm.bench.peers import MAX_CONCURRENCY, MAX_REQUESTS, Case
from radixlm.bench.workload import MAX_LENGTH, parse_range


def test_a_case_parses() -> None:
    assert Case.parse("random@16:32") == Case("random", 16, 32)


@pytest.mark.parametrize("text", ["random@0:1", "random@1:0", "random@1:-1", "random@-3:4",
                                  f"random@{MAX_CONCURRENCY + 1}:1", f"random@1:{MAX_REQUESTS + 1}",
                                  "random@1000000000:1", "random@nan:1", "random@1.5:2", "random@1", "", "@:"])
def test_bad_cases_are_value_errors(text: str) -> None:
    with pytest.raises(ValueError, match="case"):
        Case.parse(text)


@pytest.mark.parametrize("text", ["", "abc", "nan-3", "0-0", "5-2", "-1", f"1-{MAX_LENGTH + 1}", "1-1000000000",
                                  "1e-45", "inf"])
def test_bad_length_ranges_are_value_errors(text: str) -> None:
    with pytest.raises(ValueError):
        parse_range(text)


def test_length_ranges_parse() -> None:
    assert parse_range("64-512") == (64, 512)
    assert parse_range("128") == (128, 128)
    assert parse_range(f"1-{MAX_LENGTH}") == (1, MAX_LENGTH)


def test_the_peer_column_takes_the_peer_name(capsys) -> None:
    from radixlm.bench.peers import ServerCost, print_costs, print_table

    case = Case("random", 32, 64)
    columns = {"vllm": {case: {"output_tok_per_s": 500.0, "itl_p50": 0.05}},
               "radixlm --dtype bfloat16": {case: {"output_tok_per_s": 550.0, "itl_p50": 0.04}}}
    print_table(columns, [case], "vllm")
    print_costs({"vllm": ServerCost(60.0, 10**9), "radixlm --dtype bfloat16": ServerCost(5.0, 2 * 10**9)}, "vllm")
    out = capsys.readouterr().out
    assert "radixlm --dtype bfloat16 / vllm" in out and "| 1.10x |" in out and "peak RSS / vllm's" in out
    assert "2.00x" in out and "llama-server" not in out
    print_table(columns, [case])  # no peer: both as radixlm columns, the second against the first
    assert "/ vllm" in capsys.readouterr().out


def test_each_case_draws_its_own_prompts(monkeypatch) -> None:
    """Case i uses seed + i: a later case never repeats an earlier one's prompts on the same server (a prefix cache
    would serve them from memory), and every server gets the same prompts for a case."""
    from radixlm.bench import peers

    seeds = []

    class Result:
        def summary(self) -> dict[str, float]:
            return {"output_tok_per_s": 1.0, "itl_p50": 0.0, "ttft_p50": 0.0, "failed": 0}

    async def fake_run_all(base_url, options, tokenizer):
        seeds.append(options.spec.seed)
        return [Result()]

    monkeypatch.setattr(peers, "run_all", fake_run_all)
    cases = [Case("random", 1, 8), Case("random", 16, 32), Case("shared-prefix", 32, 32)]
    peers.measure("http://x", cases, None, 7, ("64-256", None))
    peers.measure("http://y", cases, None, 7, ("64-256", None))
    assert seeds == [7, 8, 9, 7, 8, 9]


def test_bandwidth_of_no_readable_tensors_falls_back_to_a_fresh_buffer():
    """On a CPU where every linear reads a packed copy (fbgemm's int8 weights without the int8 kernel), `bench step`
    still has a bound to divide by."""
    from radixlm.bench.step import tensors_bandwidth

    assert tensors_bandwidth([]) > 0
    assert tensors_bandwidth([torch.ones(1 << 16)]) > 0
