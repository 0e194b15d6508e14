"""The local stack's work-dir lock and endpoints file: one stack per directory, and helpers
find the running one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.devcluster import workdir
from services.devcluster.workdir import WorkdirBusyError, WorkdirLock


def test_a_second_lock_on_a_held_work_dir_names_the_holder(tmp_path: Path) -> None:
    first = WorkdirLock(tmp_path / "up")
    first.acquire()
    try:
        with pytest.raises(
            WorkdirBusyError, match=f"in use by another dra-suite stack \\(pid {os.getpid()}\\)"
        ):
            WorkdirLock(tmp_path / "up").acquire()
    finally:
        first.release()
    again = WorkdirLock(tmp_path / "up")
    again.acquire()  # released: free again
    again.release()


def test_a_fresh_start_clears_everything_but_the_lock(tmp_path: Path) -> None:
    lock = WorkdirLock(tmp_path / "up")
    lock.acquire()
    (tmp_path / "up" / "logs").mkdir()
    (tmp_path / "up" / "logs" / "health.log").write_text("{}\n")
    (tmp_path / "up" / "kubeconfig.yaml").write_text("")
    lock.clear()
    assert [p.name for p in (tmp_path / "up").iterdir()] == [".lock"]
    lock.release()


def test_endpoints_are_read_only_while_a_stack_holds_the_dir(tmp_path: Path) -> None:
    where = tmp_path / "up"
    assert workdir.read_endpoints(where) is None  # no dir at all
    lock = WorkdirLock(where)
    lock.acquire()
    workdir.write_endpoints(where, {"nats_url": "nats://127.0.0.1:1"})
    assert workdir.read_endpoints(where) == {"nats_url": "nats://127.0.0.1:1"}
    lock.release()
    assert workdir.read_endpoints(where) is None  # left over from a stack that is gone
