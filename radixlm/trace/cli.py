"""`radixlm replay TRACE [scheduler flags]` and `radixlm trace show|export`.

A trace is validated when it is loaded and the what-if flags before they are used; every problem raises TraceError
(a ValueError), which `radixlm`'s main prints as one line before exiting with status 2.
"""

from __future__ import annotations

import argparse
from typing import Any

WHAT_IF_FLAGS = (("--max-num-batched-tokens", int), ("--max-num-seqs", int), ("--schedule-policy", str),
                 ("--num-kv-blocks", int))


def _cmd_replay(args: argparse.Namespace) -> None:
    from radixlm.trace.replay import Trace, replay

    trace = Trace.load(args.trace)
    overrides = {flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_")) for flag, _ in WHAT_IF_FLAGS}
    overrides = {name: value for name, value in overrides.items() if value is not None}
    if overrides:
        from radixlm.trace.trace_file import check_what_if_overrides

        check_what_if_overrides(trace.config, trace.of("arrival"), overrides)
        _what_if(trace, overrides)
        return
    num_matched, divergence = replay(trace)
    if divergence is not None:
        print(f"replayed {num_matched} steps, then {divergence}")
        raise SystemExit(1)
    print(f"replayed {num_matched} steps: every step scheduled the recorded chunks (0 divergences)")


def _what_if(trace: Any, overrides: dict[str, Any]) -> None:
    from radixlm.trace.what_if import FEATURES, CostModel, recorded_metrics, simulate

    model = CostModel.fit(trace)
    print("step cost model (s): " + " + ".join(f"{c:.3g}*{f}" for c, f in zip(model.coefficients, FEATURES,
                                                                             strict=True)))
    rows = {"recorded": recorded_metrics(trace).summary(), "model, recorded flags": simulate(trace, model).summary(),
            f"what-if {overrides}": simulate(trace, model, **overrides).summary()}
    print("| run | TTFT mean (s) | TTFT p50 (s) | ITL p50 (ms) | output tok/s |\n|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['ttft_mean']:.3f} | {row['ttft_p50']:.3f} | {row['itl_p50'] * 1000:.1f} | "
              f"{row['output_tok_per_s']:.1f} |")


def _cmd_show(args: argparse.Namespace) -> None:
    from radixlm.trace.replay import Trace
    from radixlm.trace.timeline import request_timeline

    print("\n".join(request_timeline(Trace.load(args.trace), args.request)))


def _cmd_export(args: argparse.Namespace) -> None:
    from radixlm.trace.replay import Trace
    from radixlm.trace.timeline import export_chrome
    from radixlm.trace.trace_file import display_path

    export_chrome(Trace.load(args.trace), args.chrome)
    print(f"wrote {display_path(args.chrome)} (open it in https://ui.perfetto.dev or chrome://tracing)")


def add_trace_commands(commands: Any) -> None:
    replay = commands.add_parser("replay", help="replay a --trace file through a fresh scheduler (no model); with "
                                                "scheduler flags, a what-if run timed by a fitted cost model")
    replay.add_argument("trace")
    for flag, kind in WHAT_IF_FLAGS:
        replay.add_argument(flag, type=kind, default=None, help="what-if: run the trace's requests with this value")
    replay.set_defaults(handler=_cmd_replay)

    trace = commands.add_parser("trace", help="read a --trace file")
    kinds = trace.add_subparsers(dest="trace_kind", required=True)
    show = kinds.add_parser("show", help="one request's life: queued, chunks, hits, preemptions, first token, end")
    show.add_argument("trace")
    show.add_argument("--request", required=True, help="the request id")
    show.set_defaults(handler=_cmd_show)
    export = kinds.add_parser("export", help="the Trace Event format for Perfetto / chrome://tracing")
    export.add_argument("trace")
    export.add_argument("--chrome", required=True, help="output JSON path")
    export.set_defaults(handler=_cmd_export)
