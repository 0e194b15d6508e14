"""A local stack's work directory: one stack at a time, and the endpoints it left for helpers.

`make demo` and `make up` each have their own directory; the lock makes a second stack on the
same directory fail with a clear message instead of wiping the running one's files. The lock
is an flock on `<workdir>/.lock`, so it goes away with the process that held it, even on
SIGKILL. Its children do not: they run in process groups of their own (a Ctrl-C must reach
only `up`, which stops them in order), so a `kill -9` of `up` leaves nats-server, the API
emulator and the agents running. The holder therefore records every child it starts in the
lock file (`record()`: pid, start time, name); the next `acquire()` finds those still alive
(same pid and start time, so a reused pid is not taken for one) and refuses with
OrphanedProcessesError, which names them and the command that stops them. Nothing here starts
or stops processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ENDPOINTS_FILE",
    "Child",
    "NoStackError",
    "OrphanedProcessesError",
    "WorkdirBusyError",
    "WorkdirLock",
    "read_endpoints",
    "write_endpoints",
]

ENDPOINTS_FILE = "endpoints.json"
_LOCK_FILE = ".lock"
_CHILD = "child"


@dataclass(frozen=True, slots=True)
class Child:
    """A process a stack started, as recorded in the lock file."""

    name: str
    pid: int
    started: str
    """Its start time in clock ticks since boot (/proc/<pid>/stat), "" where unknown."""


class WorkdirBusyError(RuntimeError):
    """Another stack runs on this work directory."""

    def __init__(self, workdir: Path, holder: str) -> None:
        super().__init__(
            f"{workdir} is in use by another dra-suite stack (pid {holder or 'unknown'}): "
            "stop it first (Ctrl-C where it runs), or give this one another --workdir"
        )
        self.workdir = workdir
        self.holder = holder


class OrphanedProcessesError(RuntimeError):
    """A stack that ran here was killed and left processes running."""

    def __init__(self, workdir: Path, holder: str, orphans: list[Child]) -> None:
        named = ", ".join(f"{child.name} (pid {child.pid})" for child in orphans)
        pids = " ".join(str(child.pid) for child in orphans)
        super().__init__(
            f"{workdir}: the stack that ran here (pid {holder or 'unknown'}) was killed without "
            f"stopping its processes, and they still run: {named}. Stop them first "
            f"(`kill {pids}`), then start again; starting beside them would run a second "
            "nats-server on the same store"
        )
        self.workdir = workdir
        self.orphans = orphans


class NoStackError(RuntimeError):
    """No `python -m devcluster up` runs on this work directory (a helper has nothing to act on)."""

    def __init__(self, workdir: Path, *, alternative: str = "") -> None:
        super().__init__(
            f"no stack is running under {workdir}: start one with `make up` "
            f"(or `python -m devcluster up --workdir ...`){alternative}"
        )
        self.workdir = workdir


class WorkdirLock:
    """An exclusive, non-blocking lock on a work directory, held while a stack runs there."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.workdir / _LOCK_FILE

    def acquire(self) -> None:
        """Take the lock (it records our pid), or raise at once: WorkdirBusyError while a stack
        runs here, OrphanedProcessesError while processes of a killed one still do."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip().split("\n")[0]
            os.close(fd)
            raise WorkdirBusyError(self.workdir, holder) from None
        holder, children = _parse(os.read(fd, 1 << 16).decode(errors="replace"))
        orphans = [child for child in children if _alive(child)]
        if orphans:
            os.close(fd)  # unlocks: the record stays for the next try
            raise OrphanedProcessesError(self.workdir, holder, orphans)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def record(self, name: str, pid: int | None) -> None:
        """Note a child process started under this lock, for the next `acquire()`."""
        if self._fd is None or pid is None:
            return
        os.write(self._fd, f"{_CHILD} {pid} {_start_time(pid) or '-'} {name}\n".encode())

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            # Unlocked by close; the file stays, so a waiting second stack never sees two files.
            os.close(fd)

    def clear(self) -> None:
        """Remove everything under the work directory except the lock (a fresh start)."""
        for child in self.workdir.iterdir():
            if child.name == _LOCK_FILE:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _parse(text: str) -> tuple[str, list[Child]]:
    """(holder pid, children) of a lock file's text."""
    lines = text.splitlines()
    holder = lines[0].strip() if lines else ""
    children = []
    for line in lines[1:]:
        fields = line.split(maxsplit=3)
        if len(fields) == 4 and fields[0] == _CHILD and fields[1].isdigit():
            started = "" if fields[2] == "-" else fields[2]
            children.append(Child(name=fields[3], pid=int(fields[1]), started=started))
    return holder, children


def _start_time(pid: int) -> str:
    """The process's start time (field 22 of /proc/<pid>/stat); "" where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def _alive(child: Child) -> bool:
    """Whether `child` still runs: the pid exists, is no zombie, and started when recorded."""
    try:
        os.kill(child.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process now: the start time below tells
    stat = Path(f"/proc/{child.pid}/stat")
    if not stat.parent.exists():
        return not child.started  # no /proc: the pid is all there is to go by
    try:
        fields = stat.read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return False
    return fields[0] != "Z" and (not child.started or fields[19] == child.started)


def write_endpoints(workdir: Path, endpoints: dict[str, Any]) -> Path:
    path = workdir / ENDPOINTS_FILE
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps(endpoints, indent=2, sort_keys=True) + "\n")
    temp.replace(path)
    return path


def read_endpoints(workdir: Path) -> dict[str, Any] | None:
    """What a running `python -m devcluster up` recorded, or None when no stack runs there."""
    if not workdir.is_dir():
        return None
    lock = WorkdirLock(workdir)
    try:
        lock.acquire()
    except WorkdirBusyError:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            endpoints: dict[str, Any] = json.loads((workdir / ENDPOINTS_FILE).read_text())
            return endpoints
        return None
    lock.release()  # we got it: nobody runs there, whatever files are left
    return None
