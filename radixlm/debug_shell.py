"""`radixlm debug`: an interactive prompt over an engine, one step at a time.

Commands (read from stdin, so a test or a file can script it): `add [key=value ...] PROMPT`, `step [N]`, `batch`,
`queue`, `blocks`, `tree`, `request ID`, `help`, `quit`. `add` takes SamplingParams fields as key=value
(temperature=0 max_tokens=16 n=2 ...) before the prompt text.
"""

from __future__ import annotations

import cmd
import io
import shlex
import sys
from typing import IO, Any

from radixlm.core.radix_node import RadixNode
from radixlm.engine.llm_engine import LLMEngine
from radixlm.sampling_params import SamplingParams
from radixlm.trace.bounded_json import loads_bounded

MAX_TOKENS_SHOWN = 8
# Bounds on what one typed line may ask for; the line is refused with an error, and the prompt goes on.
MAX_LINE_CHARS = 2**20  # longer than any prompt that fits a context
MAX_VALUE_DEPTH = 128  # a key=value JSON value (structured_outputs schemas stop at 100 levels themselves)
MAX_STEPS_PER_COMMAND = 100_000
MAX_ERROR_CHARS = 500


class BoundedLines:
    """A text stream's lines cut at `max_chars` + 1 characters: the rest of a longer line is read and dropped in
    bounded pieces, so a line with no end costs bounded memory (the shell then refuses the cut line as too long)."""

    def __init__(self, stream: IO[str], max_chars: int) -> None:
        self._stream = stream
        self._max_chars = max_chars

    def readline(self) -> str:
        line = self._stream.readline(self._max_chars + 1)
        rest = line
        while len(rest) >= self._max_chars and not rest.endswith("\n"):
            rest = self._stream.readline(self._max_chars)
        return line


class DebugShell(cmd.Cmd):
    intro = "radixlm debug: add, step [n], batch, queue, blocks, tree, request ID, quit (help COMMAND for more)"
    prompt = "(radixlm) "

    def __init__(self, engine: LLMEngine, stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> None:
        """Reads `stdin` (default: the terminal, with line editing; or sys.stdin when that is a file or a pipe).
        Bytes that are not UTF-8 arrive as lone surrogates (the stream is switched to surrogateescape), so the line
        holding them is refused instead of ending the session."""
        if stdin is None and not sys.stdin.isatty():
            stdin = sys.stdin  # a script: read it line by line, within bounds
        source = stdin if stdin is not None else sys.stdin
        if isinstance(source, io.TextIOWrapper) and source.errors == "strict":
            source.reconfigure(errors="surrogateescape")
        super().__init__(stdin=None if stdin is None else BoundedLines(stdin, MAX_LINE_CHARS),  # type: ignore[arg-type]
                         stdout=stdout)
        self.use_rawinput = stdin is None
        self.engine = engine
        self._next_id = 0
        self._texts: dict[str, dict[int, str]] = {}

    def _print(self, text: str) -> None:
        self.stdout.write(text + "\n")

    def onecmd(self, line: str) -> bool:
        """Run one typed line; any problem with it (a typo, a bad value, hostile text) prints `error: ...` and the
        session goes on."""
        try:
            check_line(line)
            return super().onecmd(line)
        except (ValueError, KeyError, TypeError) as error:
            text = str(error) if str(error).isprintable() else ascii(str(error))
            self._print(f"error: {text[:MAX_ERROR_CHARS]}{'...' if len(text) > MAX_ERROR_CHARS else ''}")
            return False

    def emptyline(self) -> bool:
        return False

    def do_add(self, arg: str) -> None:
        """add [key=value ...] PROMPT: queue a request (SamplingParams fields as key=value, e.g. max_tokens=16)."""
        words = shlex.split(arg)
        options: dict[str, Any] = {}
        while words and "=" in words[0]:
            key, value = words.pop(0).split("=", 1)
            options[key] = parse_value(key, value)
        if not words:
            raise ValueError("add needs a prompt")
        request_id = f"r{self._next_id}"
        self.engine.add_request(request_id, " ".join(words), SamplingParams.from_dict(options))
        self._next_id += 1  # only once added: a refused line takes no id
        self._print(f"added {request_id}")

    def do_step(self, arg: str) -> None:
        """step [N]: run N engine steps (default 1), printing each step's chunks and new text."""
        num_steps = int(arg or 1)
        if not 1 <= num_steps <= MAX_STEPS_PER_COMMAND:
            raise ValueError(f"step takes a count in [1, {MAX_STEPS_PER_COMMAND}], got {num_steps}")
        for _ in range(num_steps):
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
        stack: list[tuple[RadixNode, int]] = [(child, 1) for child in reversed(tree.root.children.values())]
        while stack:  # depth first, iteratively: a tree grown by many nested prompts may be deeper than recursion
            child, depth = stack.pop()
            tokens = child.token_ids[:MAX_TOKENS_SHOWN]
            more = "..." if len(child.token_ids) > MAX_TOKENS_SHOWN else ""
            self._print(f"{'  ' * depth}[{child.start}, {child.end}) {len(child.token_ids)} tokens {tokens}{more} "
                        f"blocks {child.block_ids} lock {child.lock_ref} last access {child.last_access}")
            stack.extend((grandchild, depth + 1) for grandchild in reversed(child.children.values()))

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


def check_line(line: str) -> None:
    """Refuse a line before any command reads it: longer than MAX_LINE_CHARS, or not valid text (lone surrogates:
    bytes that were not UTF-8, which no tokenizer or terminal can take)."""
    if len(line) > MAX_LINE_CHARS:
        raise ValueError(f"the line is longer than {MAX_LINE_CHARS} characters")
    if not line.isascii():
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(f"the line is not valid UTF-8 text (column {error.start + 1})") from None


def parse_value(key: str, value: str) -> Any:
    """A key=value option's value: JSON when it looks like JSON (a number, a list, an object, true / false / null, a
    quoted string), within bounds (finite numbers, bounded nesting); otherwise the text itself."""
    if value[:1] not in "-0123456789[{tfn\"":
        return value
    try:
        return loads_bounded(value, MAX_VALUE_DEPTH)
    except ValueError as error:
        raise ValueError(f"{key}: the value {error}") from None
