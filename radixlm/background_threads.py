"""Background threads that must not take a core from the model's step: grammar compiles, big tokenizer jobs.

On 2 cores a busy extra thread is the worst cliff there is: torch's intra-op threads wait for each other at every
op, so a step whose second thread loses its core to a 40-second grammar compile runs several times slower, for
every client at once. `lower_priority` (a ThreadPoolExecutor initializer) gives the calling thread the lowest CPU
priority (Linux: per-thread nice 19), so it runs on the time the step leaves idle. Elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
from functools import cache

LOWEST_PRIORITY = 19


def lower_priority() -> None:
    """Make the calling thread yield its core to normal-priority threads (best effort: nothing on failure)."""
    with contextlib.suppress(AttributeError, OSError):  # no setpriority on this platform, or not permitted
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError):
        return ctypes.CDLL(name) if name else None
    return None


def release_free_memory() -> None:
    """Give the heap's free pages back to the system (glibc's malloc_trim: every thread's arena), after work that
    freed much (a big grammar compile leaves its temporaries in the compiling thread's arena, where nothing else
    would reuse them). A no-op without glibc."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)
