"""A local stack's work directory: one stack at a time, and the endpoints it left for helpers.

`make demo` and `make up` each have their own directory; the lock makes a second stack on the
same directory fail with a clear message instead of wiping the running one's files. The lock
is an flock on `<workdir>/.lock`, so it goes away with the process that held it, even on
SIGKILL. Nothing here starts or stops processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any

__all__ = [
    "ENDPOINTS_FILE",
    "NoStackError",
    "WorkdirBusyError",
    "WorkdirLock",
    "read_endpoints",
    "write_endpoints",
]

ENDPOINTS_FILE = "endpoints.json"
_LOCK_FILE = ".lock"


class WorkdirBusyError(RuntimeError):
    """Another stack runs on this work directory."""

    def __init__(self, workdir: Path, holder: str) -> None:
        super().__init__(
            f"{workdir} is in use by another dra-suite stack (pid {holder or 'unknown'}): "
            "stop it first (Ctrl-C where it runs), or give this one another --workdir"
        )
        self.workdir = workdir
        self.holder = holder


class NoStackError(RuntimeError):
    """No `dra-suite up` runs on this work directory (a helper has nothing to act on)."""

    def __init__(self, workdir: Path, *, alternative: str = "") -> None:
        super().__init__(
            f"no stack is running under {workdir}: start one with `make up` "
            f"(or `dra-suite up --workdir ...`){alternative}"
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
        """Take the lock (it records our pid), or raise WorkdirBusyError at once."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise WorkdirBusyError(self.workdir, holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

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


def write_endpoints(workdir: Path, endpoints: dict[str, Any]) -> Path:
    path = workdir / ENDPOINTS_FILE
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps(endpoints, indent=2, sort_keys=True) + "\n")
    temp.replace(path)
    return path


def read_endpoints(workdir: Path) -> dict[str, Any] | None:
    """What a running `dra-suite up` recorded, or None when no stack runs there."""
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
