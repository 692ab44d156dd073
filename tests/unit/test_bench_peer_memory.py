"""`bench peers` counts a server's memory in every process of its tree, as a server that holds its model in a child
process (vLLM's worker) has it there."""

import subprocess
import sys
import time

from radixlm.bench.peers import peak_rss_bytes, process_peak_rss_bytes

HOLD_BYTES = 256 << 20
CHILD = f"b = bytearray({HOLD_BYTES}); b[::4096] = b'x' * len(b[::4096]); print('held', flush=True); input()"


def test_the_peak_covers_a_child_that_holds_the_memory():
    # A shell that starts the child, as `bench peers` starts a peer's script.
    parent = subprocess.Popen(["bash", "-c", f'{sys.executable} -c "{CHILD}"; true'], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "held"
        time.sleep(0.1)
        assert process_peak_rss_bytes(parent.pid) < HOLD_BYTES // 4  # the shell alone
        assert peak_rss_bytes(parent.pid) >= HOLD_BYTES
    finally:
        parent.communicate("\n", timeout=30)


def test_a_process_that_is_gone_counts_nothing():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert peak_rss_bytes(process.pid) == 0
