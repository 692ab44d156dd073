"""How the engine starts its processes (a worker process, tensor-parallel ranks): forked from a forkserver.

A spawned child starts a fresh interpreter and imports torch, transformers and the worker's modules before it can
load a model: 5-8 s on 2 cores, and tensor-parallel ranks do it side by side. Forking the engine's own process is
not safe once it has run OpenMP threads (libgomp's pool does not survive a fork). A forkserver is both: one clean
process, spawned at the first start, that imports `WORKER_MODULES` once and runs nothing else; each child is forked
from it, so it begins with those modules imported and no threads. It is multiprocessing's own mechanism (Python
3.14's default on Linux) and keeps spawn's contract: the target and its arguments are pickled, nothing else of the
parent is inherited, except that the parent's environment is passed along (`os.environ` as it is at each start, as
a spawned child would see it), since the forkserver's own is fixed when it starts.

Variables a library reads once as it loads (OpenMP's `OMP_NUM_THREADS`, read when torch is imported) are the
forkserver's: those of the moment it started (`--num-threads` sets a worker's threads after the fork).
The forkserver lives as long as the process that started it, idle between starts (it exits with that process); its
imported modules (about 350 MB resident) are shared, copy-on-write, by the children forked from it.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

# What every child needs before it can build a worker: imported once, in the forkserver.
WORKER_MODULES = ("radixlm.worker.process", "radixlm.worker.worker", "radixlm.worker.tensor_parallel.rank")


def _context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context the engine's children start in."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(WORKER_MODULES))  # takes effect when the forkserver starts
    return context


def start_forkserver() -> None:
    """Start the forkserver now, if it is not running, without waiting for it: it imports the worker's modules while
    this process goes on (a server imports its own meanwhile)."""
    _context()
    multiprocessing.forkserver.ensure_running()


def start_process(target: Callable[..., None], args: tuple[Any, ...], name: str) -> BaseProcess:
    """Start `target(*args)` in a daemonic child of this process's forkserver, in this process's environment."""
    process = _context().Process(target=_in_environment, args=(dict(os.environ), target, *args), name=name,
                                        daemon=True)
    process.start()
    return process


def _in_environment(environment: dict[str, str], target: Callable[..., None], *args: Any) -> None:
    os.environ.clear()
    os.environ.update(environment)
    target(*args)
