"""`radixlm serve` whose engine waits for a file before it loads: lets a test watch the server while it loads.

Usage: python slow_load_server.py RELEASE_FILE radixlm-serve-args...
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from radixlm import cli
from radixlm.engine import llm_engine
from radixlm.server import api_server


def main() -> None:
    release_file = Path(sys.argv[1])
    real_build_engine = llm_engine.build_engine

    def build_engine_when_released(**options: object) -> llm_engine.LLMEngine:
        while not release_file.exists():
            time.sleep(0.05)
        return real_build_engine(**options)

    api_server.build_engine = build_engine_when_released  # the server's own code path, with a slower load
    cli.main(["serve", *sys.argv[2:]])


if __name__ == "__main__":
    main()
