"""`radixlm debug` scripted through stdin: add, step, batch, queue, blocks, tree, request; a bad command is an
error line, not the end of the session."""

import io

from radixlm.debug_shell import DebugShell
from radixlm.engine.llm_engine import build_engine

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
