"""`benchmarks/huge_pages.py` runs end to end (tiny model, tiny attention shape) and reports both placements."""

import re

import torch

from benchmarks.attention import AttentionShape
from benchmarks.huge_pages import attention_ab, main

REPORT = re.compile(r".+: plain [\d.]+ .+, huge pages [\d.]+ .+ \([\d.]+x; huge pages faster in \d+ of (\d+) pairs\)")


def test_both_measurements_report_every_pair(tiny_model_dir, capsys):
    main(["--pairs", "2", "--output-len", "3", "--skip-attention", "--model", str(tiny_model_dir("llama")),
          "--num-kv-blocks", "32", "--block-size", "4"])
    attention_ab(AttentionShape(num_layers=2, num_heads=2, num_kv_heads=1, distinct_layers=2), batch=2,
                 context_len=40, dtype=torch.float32, pairs=2)
    lines = capsys.readouterr().out.splitlines()
    reports = [match for match in map(REPORT.fullmatch, lines) if match]
    assert len(reports) == 2 and all(match.group(1) == "2" for match in reports)
    assert re.match(r"batch-1 generation, [1-9]\d* linears", reports[0].group(0))
    assert reports[1].group(0).startswith("attention")
