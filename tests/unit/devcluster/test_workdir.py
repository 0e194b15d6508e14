"""The local stack's work-dir lock and endpoints file: one stack per directory, helpers find
the running one, and processes a killed stack left running are found and refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devcluster import workdir
from devcluster.workdir import OrphanedProcessesError, WorkdirBusyError, WorkdirLock


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


_HOLDER = """
import subprocess, sys, time
from pathlib import Path
from devcluster.workdir import WorkdirLock
lock = WorkdirLock(Path(sys.argv[1]))
lock.acquire()
child = subprocess.Popen(["sleep", "60"], start_new_session=True)
lock.record("nats-server", child.pid)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_processes_a_killed_holder_left_running_are_named_and_refused(tmp_path: Path) -> None:
    """`kill -9` of `devcluster up` leaves its children (own process groups) running: the next
    stack must not start beside them (a second nats-server on the same store)."""
    where = tmp_path / "up"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(where)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    orphan = int(holder.stdout.readline())
    try:
        holder.kill()  # SIGKILL: the flock goes, the child stays
        holder.wait(10)
        holder.stdout.close()
        with pytest.raises(OrphanedProcessesError) as refused:
            WorkdirLock(where).acquire()
        message = str(refused.value)
        assert f"the stack that ran here (pid {holder.pid}) was killed" in message
        assert f"nats-server (pid {orphan})" in message
        assert f"`kill {orphan}`" in message
        assert [c.pid for c in refused.value.orphans] == [orphan]
        assert WorkdirLock(where).path.exists()  # still refused until they are gone
        with pytest.raises(OrphanedProcessesError):
            WorkdirLock(where).acquire()
    finally:
        os.kill(orphan, signal.SIGKILL)
    _reap(orphan)
    lock = WorkdirLock(where)
    lock.acquire()  # gone: free again
    lock.release()


def _reap(pid: int) -> None:
    """Wait until `pid` is gone (it is no child of ours: init reaps it)."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists():
        state = (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        if state == "Z" or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def test_a_reused_pid_is_not_taken_for_an_orphan(tmp_path: Path) -> None:
    where = tmp_path / "up"
    where.mkdir()
    # Our own pid, recorded with another start time: a process that reused the pid.
    (where / ".lock").write_text(f"1\nchild {os.getpid()} 1 apiserver\n")
    lock = WorkdirLock(where)
    lock.acquire()
    lock.release()


def test_a_stopped_stack_leaves_nothing_to_refuse(tmp_path: Path) -> None:
    where = tmp_path / "up"
    lock = WorkdirLock(where)
    lock.acquire()
    done = subprocess.Popen(["true"])
    done.wait()
    lock.record("discovery", done.pid)
    lock.release()
    again = WorkdirLock(where)
    again.acquire()
    again.release()
