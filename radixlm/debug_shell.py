"""`radixlm debug`: an interactive prompt over an engine, one step at a time.

Commands (read from stdin, so a test or a file can script it): `add [key=value ...] PROMPT`, `step [N]`, `batch`,
`queue`, `blocks`, `tree`, `request ID`, `help`, `quit`. `add` takes SamplingParams fields as key=value
(temperature=0 max_tokens=16 n=2 ...) before the prompt text.
"""

from __future__ import annotations

import cmd
import json
import shlex
from typing import IO, Any

from radixlm.core.radix_cache import RadixNode
from radixlm.engine.llm_engine import LLMEngine
from radixlm.sampling_params import SamplingParams

MAX_TOKENS_SHOWN = 8


class DebugShell(cmd.Cmd):
    intro = "radixlm debug: add, step [n], batch, queue, blocks, tree, request ID, quit (help COMMAND for more)"
    prompt = "(radixlm) "

    def __init__(self, engine: LLMEngine, stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> None:
        super().__init__(stdin=stdin, stdout=stdout)
        self.use_rawinput = stdin is None
        self.engine = engine
        self._next_id = 0
        self._texts: dict[str, dict[int, str]] = {}

    def _print(self, text: str) -> None:
        self.stdout.write(text + "\n")

    def onecmd(self, line: str) -> bool:
        try:
            return super().onecmd(line)
        except (ValueError, KeyError, TypeError) as error:  # a typo must not end the session
            self._print(f"error: {error}")
            return False

    def emptyline(self) -> bool:
        return False

    def do_add(self, arg: str) -> None:
        """add [key=value ...] PROMPT: queue a request (SamplingParams fields as key=value, e.g. max_tokens=16)."""
        words = shlex.split(arg)
        options: dict[str, Any] = {}
        while words and "=" in words[0]:
            key, value = words.pop(0).split("=", 1)
            options[key] = json.loads(value) if value[:1] in "-0123456789[{tfn\"" else value
        if not words:
            raise ValueError("add needs a prompt")
        request_id = f"r{self._next_id}"
        self._next_id += 1
        self.engine.add_request(request_id, " ".join(words), SamplingParams.from_dict(options))
        self._print(f"added {request_id}")

    def do_step(self, arg: str) -> None:
        """step [N]: run N engine steps (default 1), printing each step's chunks and new text."""
        for _ in range(int(arg or 1)):
            if not self.engine.has_unfinished_requests():
                self._print("nothing to do")
                return
            outputs = self.engine.step()
            output = self.engine.last_scheduler_output
            chunks = ", ".join(f"{c.request_id}[{c.start_position}+{c.num_tokens}]" for c in output.chunks) \
                if output else "-"
            self._print(f"step {self.engine.num_steps - 1}: {chunks}")
            for result in outputs:
                for completion in result.outputs:
                    self._texts.setdefault(result.request_id, {})[completion.index] = completion.text
                    end = f" [{completion.finish_reason}]" if completion.finished else ""
                    self._print(f"  {result.request_id}.{completion.index}: {completion.delta_text!r}{end}")

    def do_batch(self, arg: str) -> None:
        """batch: the last step's chunks (request, start position, tokens, samples) and preemptions."""
        output = self.engine.last_scheduler_output
        if output is None:
            self._print("no step yet")
            return
        for chunk in output.chunks:
            self._print(f"{chunk.request_id}: positions {chunk.start_position}..{chunk.context_len - 1} "
                        f"({chunk.num_tokens} tokens){' samples' if chunk.samples else ''}")
        if output.preempted_request_ids:
            self._print(f"preempted: {', '.join(output.preempted_request_ids)}")

    def do_queue(self, arg: str) -> None:
        """queue: running and waiting requests with their token progress."""
        scheduler = self.engine.scheduler
        for name, requests in (("running", scheduler.running), ("waiting", list(scheduler.waiting))):
            self._print(f"{name} ({len(requests)}):")
            for request in requests:
                self._print(f"  {request.request_id}: {request.num_computed_tokens}/{request.num_tokens} computed, "
                            f"{request.num_output_tokens} generated, priority {request.priority}")

    def do_blocks(self, arg: str) -> None:
        """blocks: pool usage and each live request's block table."""
        manager = self.engine.scheduler.kv_cache_manager
        pool = manager.block_pool
        self._print(f"{pool.num_used_blocks}/{pool.num_blocks} blocks used ({pool.num_free_blocks} free), "
                    f"block size {manager.block_size}")
        for request in self.engine.scheduler.requests.values():
            self._print(f"  {request.request_id}: {request.block_table}")

    def do_tree(self, arg: str) -> None:
        """tree: the radix tree: each edge's positions, first tokens, blocks, lock refs and last access."""
        tree = self.engine.scheduler.kv_cache_manager.radix_cache
        if tree is None:
            self._print("the radix cache is off")
            return
        self._print("root")
        self._print_node_children(tree.root, 1)

    def _print_node_children(self, node: RadixNode, depth: int) -> None:
        for child in node.children.values():
            tokens = child.token_ids[:MAX_TOKENS_SHOWN]
            more = "..." if len(child.token_ids) > MAX_TOKENS_SHOWN else ""
            self._print(f"{'  ' * depth}[{child.start}, {child.end}) {len(child.token_ids)} tokens {tokens}{more} "
                        f"blocks {child.block_ids} lock {child.lock_ref} last access {child.last_access}")
            self._print_node_children(child, depth + 1)

    def do_request(self, arg: str) -> None:
        """request ID: a live request's state, or a finished one's text."""
        request = self.engine.scheduler.requests.get(arg.strip())
        if request is not None:
            self._print(f"{request!r} priority {request.priority} preemptions {request.num_preemptions} "
                        f"cached {request.num_cached_tokens}\n  output ids {request.output_token_ids}")
        texts = self._texts.get(arg.strip())
        if texts:
            for index, text in sorted(texts.items()):
                self._print(f"  text[{index}]: {text!r}")
        if request is None and not texts:
            self._print(f"no request {arg.strip()!r}")

    def do_quit(self, arg: str) -> bool:
        """quit: leave."""
        return True

    do_EOF = do_quit
