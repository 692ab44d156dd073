"""`benchmarks/sampler.py` runs end to end (tiny model, few rows) and prints every variant next to the forward."""

import re

from benchmarks.sampler import main


def test_bench_sampler_prints_each_variant_with_its_ratio(tiny_model_dir, capsys):
    main(["--num-requests", "4", "--prompt-len", "6", "--num-steps", "2",
          "--model", str(tiny_model_dir("llama")), "--num-kv-blocks", "64", "--block-size", "4"])
    table_row = re.compile(r"\| .+ \| [\d.]+ \| [\d.]+ \| [\d.]+% \|")
    rows = [line for line in capsys.readouterr().out.splitlines() if table_row.fullmatch(line)]
    assert [row.split(" | ")[0] for row in rows] == ["| all transforms", "| all, rebuilt per step",
                                                     "| top-p without top-k", "| greedy, nothing else"]
