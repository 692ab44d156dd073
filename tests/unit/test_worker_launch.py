"""The engine's children (radixlm.worker.launch): forked from a forkserver, in the parent's environment of the moment,
and free to run OpenMP threads although the parent has run its own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from radixlm.worker.launch import WORKER_MODULES, start_process

VARIABLE = "RADIXLM_LAUNCH_TEST"


def _report(path: str) -> None:
    """The child: its environment's value of VARIABLE, a sum over OpenMP threads, its parent and its modules."""
    torch.set_num_threads(2)
    total = torch.ones(1 << 22).sum().item()
    Path(path).write_text(json.dumps({"value": os.environ.get(VARIABLE), "total": total, "ppid": os.getppid(),
                                      "preloaded": all(name in sys.modules for name in WORKER_MODULES)}))


def test_children_see_the_parents_environment_of_each_start_and_run_openmp_threads(tmp_path, monkeypatch):
    torch.set_num_threads(2)
    torch.ones(1 << 22).sum()  # this process has run OpenMP threads: a plain fork of it could hang in its children
    reports = []
    for value in ("first", None, "third"):
        if value is None:
            monkeypatch.delenv(VARIABLE)
        else:
            monkeypatch.setenv(VARIABLE, value)
        path = tmp_path / f"report-{len(reports)}.json"
        process = start_process(_report, (str(path),), name="radixlm-launch-test")
        assert process.daemon
        process.join(120)
        assert process.exitcode == 0
        reports.append(json.loads(path.read_text()))
    assert [report["value"] for report in reports] == ["first", None, "third"]
    assert all(report["total"] == 1 << 22 for report in reports)
    assert all(report["preloaded"] for report in reports)
    assert all(report["ppid"] != os.getpid() for report in reports)  # forked by the forkserver, not by this process


def test_serve_starts_the_forkserver_early_only_when_the_model_runs_in_child_processes():
    from radixlm.cli import _starts_processes
    from radixlm.config import EngineConfig

    def starts(**options) -> bool:
        return _starts_processes(EngineConfig.from_kwargs(model="m", **options))

    assert not starts()
    assert starts(tensor_parallel_size=2)
    assert starts(data_parallel_size=2)
    assert starts(distributed_executor_backend="mp")
