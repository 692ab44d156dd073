"""`radixlm debug` scripted through stdin: add, step, batch, queue, blocks, tree, request; a bad command is an
error line, not the end of the session."""

import io
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from radixlm.debug_shell import MAX_LINE_CHARS, DebugShell
from radixlm.engine.llm_engine import LLMEngine, build_engine

SCRIPT = """add max_tokens=3 temperature=0 ignore_eos=true hello world
add n=2 max_tokens=2 seed=1 the quick brown fox
step
batch
queue
blocks
add bogus=1 x
step 5
tree
request r0
step
quit
"""


def test_a_scripted_session(tiny_model_dir):
    engine = build_engine(model=str(tiny_model_dir("llama")), num_kv_blocks=64, block_size=4)
    out = io.StringIO()
    DebugShell(engine, stdin=io.StringIO(SCRIPT), stdout=out).cmdloop()
    text = out.getvalue()
    assert "added r0" in text and "added r1" in text
    assert "step 0: r0[0+" in text and "r1[0+" in text
    assert "samples" in text  # batch
    assert "running (3):" in text and "r1#1:" in text  # queue, after the fork
    assert "blocks used" in text and "r1#1: [" in text
    assert "error: bogus is not a sampling parameter" in text
    assert "[length]" in text and "nothing to do" in text
    assert "root" in text and "lock 0" in text  # tree
    assert "text[0]:" in text
    assert not engine.has_unfinished_requests()


HOSTILE_LINES = [  # (a typed line, what its error says); each used to end the session, hang, or pass unnoticed
    ("add max_tokens=" + "[" * 10_000 + "]" * 10_000 + " hi", "nested deeper than"),
    ("add max_tokens=" + "[" * 10_000 + " hi", "nested deeper than"),
    ("add logit_bias=" + '{"1":' * 10_000 + "1" + "}" * 10_000 + " hi", "nested deeper than"),
    ("add temperature=-Infinity hi", "not a number JSON allows"),
    ("add temperature=1e999 hi", "out of range"),
    ("add hi \ud800 there", "not valid UTF-8 text"),
    ("add " + "x " * 2**20, "longer than"),
    ("step 0", "step takes a count"),
    ("step -1", "step takes a count"),
    ("step 99999999999", "step takes a count"),
]
STILL_ERRORS = [  # refused before too; they must stay refused, in the same session as the lines above
    "add temperature=NaN hi", "add max_tokens=1e-45 hi", "add bogus=1 hi", "add n=1000000000 hi",
    "add best_of=1000000000 hi", "add max_tokens=-1 hi", "add 'unbalanced quote", "add max_tokens=" + "9" * 5000,
    "step 1e5",
]


@pytest.fixture
def engine(tiny_model_dir: Callable[[str], Path]) -> LLMEngine:
    return build_engine(model=str(tiny_model_dir("llama")), num_kv_blocks=64, block_size=4)


def run_session(engine: LLMEngine, stdin: IO[str]) -> list[str]:
    out = io.StringIO()
    DebugShell(engine, stdin=stdin, stdout=out).cmdloop()
    return out.getvalue().split("(radixlm) ")[1:]  # what each line printed


@pytest.mark.parametrize(("line", "expected"), HOSTILE_LINES, ids=lambda value: repr(value)[:30])
def test_a_hostile_line_is_an_error_and_the_session_goes_on(engine, line, expected):
    replies = run_session(engine, io.StringIO(f"{line}\nqueue\nquit\n"))
    assert replies[0].startswith("error: ") and expected in replies[0] and replies[0].count("\n") == 1, replies[0]
    assert replies[1] == "running (0):\nwaiting (0):\n"


def test_every_hostile_line_in_one_session(engine):
    lines = [line for line, _ in HOSTILE_LINES] + STILL_ERRORS
    replies = run_session(engine, io.StringIO("\n".join([*lines, "add max_tokens=2 hi", "step 3", "quit"]) + "\n"))
    assert [reply.startswith("error: ") for reply in replies[:len(lines)]] == [True] * len(lines), replies
    assert replies[len(lines)] == "added r0\n" and "[length]" in replies[len(lines) + 1]


def test_bytes_that_are_not_utf8_are_an_error_line(engine):
    stdin = io.TextIOWrapper(io.BytesIO(b"add hi \xff\xfe there\nqueue\nquit\n"), encoding="utf-8")
    replies = run_session(engine, stdin)
    assert replies[0].startswith("error: the line is not valid UTF-8 text"), replies
    assert replies[1] == "running (0):\nwaiting (0):\n"


def test_a_line_with_no_end_is_read_within_bounds(engine):
    stdin = io.StringIO("add " + "x" * (3 * MAX_LINE_CHARS) + "\nqueue\nquit\n")
    replies = run_session(engine, stdin)
    assert replies[0].startswith("error: the line is longer than") and replies[1].startswith("running (0)")
