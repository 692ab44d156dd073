"""The grammar compile cache's byte budget, measured on a real server: distinct ~84 KB JSON schemas in a row.

Starts `radixlm serve --grammar-cache-bytes BUDGET` on the default model, compiles one schema (the first compile
sets up what every later one shares), then sends `--num-schemas` chat requests in a row, each with a distinct
schema of 1,500 patterned string properties (the hostile probe's; `radixlm.bench.soak_hostile.pattern_schema`) and
`max_tokens: 1`. Prints the server's RSS growth over the warm baseline every 10 schemas next to the budget and the
cache's own gauge, then PASS if the growth stayed within the budget + 10%.

    .venv/bin/python benchmarks/grammar_cache_rss.py --num-schemas 200 --budget 256MiB
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import httpx

from radixlm.bench.serve import own_server
from radixlm.bench.soak_hostile import pattern_schema
from radixlm.config import parse_bytes

MIB = 2**20


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * 4096


def cache_bytes(http: httpx.Client) -> float:
    match = re.search(r"^radixlm:grammar_cache_bytes\{[^}]*\} (\S+)$", http.get("/metrics").text, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


def ask(http: httpx.Client, seed: int) -> int:
    body = {"messages": [{"role": "user", "content": "fill the form"}], "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": pattern_schema(seed)}}}
    return http.post("/v1/chat/completions", json=body, timeout=900).status_code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-schemas", type=int, default=200)
    parser.add_argument("--budget", default="256MiB", help="--grammar-cache-bytes of the server")
    args = parser.parse_args()
    if not 1 <= args.num_schemas <= 100_000:
        raise SystemExit("--num-schemas must be in [1, 100000]")
    budget = parse_bytes(args.budget, "--budget")
    with own_server(["--grammar-cache-bytes", str(budget)]) as (url, process), \
            httpx.Client(base_url=url) as http:
        assert ask(http, -1) == 200
        baseline, started, peak = rss_bytes(process.pid), time.monotonic(), 0
        print(f"warm RSS {baseline / MIB:.0f} MiB, budget {budget / MIB:.0f} MiB")
        for i in range(args.num_schemas):
            if ask(http, i) != 200:
                raise SystemExit(f"schema {i} was refused")
            peak = max(peak, rss_bytes(process.pid) - baseline)
            if (i + 1) % 10 == 0 or i + 1 == args.num_schemas:
                print(f"{i + 1} schemas in {time.monotonic() - started:.0f} s: RSS +{peak / MIB:.0f} MiB at most "
                      f"({peak / budget:.2f}x the budget), cache {cache_bytes(http) / MIB:.0f} MiB", flush=True)
        print("PASS" if peak <= 1.1 * budget else "FAIL", f"(RSS growth {peak / budget:.2f}x the budget; limit 1.10x)")


if __name__ == "__main__":
    main()
