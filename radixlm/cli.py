"""Command line: `radixlm generate`, `radixlm serve`, `radixlm bench ...`; engine flags come from the config fields."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

from radixlm.engine_args import add_engine_args, engine_kwargs

if TYPE_CHECKING:
    from radixlm.config import EngineConfig


def _cmd_generate(args: argparse.Namespace) -> None:
    from radixlm import LLM, SamplingParams

    llm = LLM(**engine_kwargs(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.sampling_seed)
    if args.chat:
        output = llm.chat([{"role": "user", "content": args.prompt}], params, use_tqdm=False)[0]
    else:
        output = llm.generate(args.prompt, params, use_tqdm=False)[0]
    print(output.outputs[0].text)


def _cmd_serve(args: argparse.Namespace) -> None:
    from radixlm.server.api_key import check_api_key

    api_key = args.api_key if args.api_key is not None else os.environ.get("RADIXLM_API_KEY")
    if api_key is not None:
        check_api_key(api_key)  # before anything loads (torch, the model): an empty key must not read as "no key"
    from radixlm.config import EngineConfig
    from radixlm.config_values import parse_bytes

    # Bad flag values fail here, before torch loads (the server's imports take seconds).
    options = engine_kwargs(args)
    config = EngineConfig.from_kwargs(**options)
    responses_store_bytes = parse_bytes(args.responses_store_bytes, "--responses-store-bytes")
    if _starts_processes(config):
        from radixlm.worker.launch import start_forkserver

        start_forkserver()  # it imports the worker's modules while this process imports the server's
    if config.parallel.node_rank > 0:  # another node of a tensor-parallel group: its ranks only, no server
        from radixlm.model.loader import resolve_model_dir
        from radixlm.worker.tensor_parallel.executor import run_node

        sys.exit(run_node(resolve_model_dir(config.model.model), config.model, config.cache, config.parallel))
    from radixlm.server.api_server import ServerOptions, run_server
    from radixlm.server.chat_options import ChatOptions

    chat = ChatOptions(chat_template=args.chat_template, tool_call_parser=args.tool_call_parser,
                       enable_auto_tool_choice=args.enable_auto_tool_choice, reasoning_parser=args.reasoning_parser)
    server = ServerOptions(host=args.host, port=args.port, api_key=api_key,
                           max_request_bytes=args.max_request_bytes, log_level=args.log_level, chat=chat,
                           responses_store_bytes=responses_store_bytes)
    if not run_server(options, server):
        sys.exit(1)


def _starts_processes(config: EngineConfig) -> bool:
    """Whether the engine runs its model in child processes (tensor-parallel ranks, replicas' or mp workers)."""
    parallel = config.parallel
    return parallel.tensor_parallel_size > 1 or parallel.data_parallel_size > 1 or \
        config.model.distributed_executor_backend == "mp"


def _cmd_debug(args: argparse.Namespace) -> None:
    from radixlm.debug_shell import DebugShell
    from radixlm.engine.llm_engine import build_engine

    DebugShell(build_engine(**engine_kwargs(args))).cmdloop()


def _add_chat_args(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("chat")
    group.add_argument("--chat-template", default=None,
                       help="override the tokenizer's chat template: a file, an inline Jinja string, or a shipped "
                            "template's name (smollm2_tools: SmolLM2's template with tool calling)")
    group.add_argument("--tool-call-parser", default=None, help="how tool calls are read from the model's text: "
                       "hermes or llama3_json (forced tool choices use hermes when unset)")
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help='let tool_choice "auto" (the default with tools) parse calls from free text')
    group.add_argument("--reasoning-parser", default=None,
                       help="split <think>...</think> into reasoning_content: deepseek_r1 or qwen3")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixlm", description=__doc__)
    parser.add_argument("--log-level", default="INFO",
                        help="radixlm's logging level (INFO shows the KV cache size and token capacity at start-up); "
                             "other libraries log warnings only")
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="print the completion of one prompt")
    generate.add_argument("prompt")
    generate.add_argument("--chat", action="store_true", help="apply the model's chat template")
    generate.add_argument("--max-tokens", type=int, default=128)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--sampling-seed", type=int, default=None)
    add_engine_args(generate)
    generate.set_defaults(handler=_cmd_generate)

    serve = commands.add_parser("serve", help="OpenAI-compatible HTTP server (chat, completions, SSE, metrics)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or $RADIXLM_API_KEY)")
    serve.add_argument("--max-request-bytes", type=int, default=16 * 2**20, help="larger bodies get 413")
    serve.add_argument("--responses-store-bytes", default="128MiB",
                       help="most bytes (JSON text) of finished /v1/responses kept for GET and previous_response_id, "
                            "oldest evicted first (default: 128MiB)")
    _add_chat_args(serve)
    add_engine_args(serve)
    serve.set_defaults(handler=_cmd_serve)

    debug = commands.add_parser("debug", help="an interactive prompt over an engine: add, step, batch, queue, "
                                              "blocks, tree, request (reads stdin)")
    add_engine_args(debug)
    debug.set_defaults(handler=_cmd_debug)

    from radixlm.bench.cli import add_bench_commands
    from radixlm.trace.cli import add_trace_commands

    add_bench_commands(commands)
    add_trace_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("radixlm").setLevel(args.log_level.upper())
    try:
        args.handler(args)
    except (FileNotFoundError, ValueError) as error:
        print(f"radixlm: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
