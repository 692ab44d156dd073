"""`radixlm serve` with faults injected into its engine, to test what reaches clients.

- A request with `top_k` 7 fails in its sampling row (its own fault: it alone ends in the error state).
- A request with `top_k` 13 makes the forward raise and the invariant check fail: the engine cannot go on.

Usage: python faulty_engine_server.py radixlm-serve-args...
"""

from __future__ import annotations

import sys

from radixlm import cli
from radixlm.engine import llm_engine
from radixlm.sample.sampler import Sampler
from radixlm.server import api_server


def main() -> None:
    real_build_engine = llm_engine.build_engine
    adjust = Sampler._adjust_logits

    def adjust_or_fail(self, logits, batch, requests, *args):  # type: ignore[no-untyped-def]
        if any(r.sampling_params.top_k == 7 for r in requests):
            raise FloatingPointError("injected sampler fault")
        return adjust(self, logits, batch, requests, *args)

    def build_faulty_engine(**options: object) -> llm_engine.LLMEngine:
        engine = real_build_engine(**options)
        execute, check = engine.runner.execute, engine.scheduler.check_invariants

        def execute_or_fail(chunks, *args):  # type: ignore[no-untyped-def]
            if any(engine.scheduler.requests[c.request_id].sampling_params.top_k == 13 for c in chunks):
                raise RuntimeError("injected forward fault")
            return execute(chunks, *args)

        def check_or_fail() -> None:
            check()
            if engine._num_failed_forwards:
                raise AssertionError("injected broken invariant")

        engine.runner.execute = execute_or_fail
        engine.scheduler.check_invariants = check_or_fail
        return engine

    Sampler._adjust_logits = adjust_or_fail
    api_server.build_engine = build_faulty_engine
    cli.main(["serve", *sys.argv[2:]] if sys.argv[1] == "serve" else ["serve", *sys.argv[1:]])


if __name__ == "__main__":
    main()
