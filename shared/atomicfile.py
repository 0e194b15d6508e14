"""Crash-safe file writes: temp file in the same directory, fsync, rename, fsync the directory.

A reader sees either the old content or the new one, never a torn file, even after a power
loss. Blocking by design (a few syscalls); async callers decide whether to use a thread.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

__all__ = [
    "fsync_dir",
    "make_dirs",
    "remove",
    "remove_temporaries",
    "temporary_path",
    "write_and_rename",
    "write_atomic",
]


def write_atomic(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace `path` with `data` atomically and durably; the file gets exactly `mode`.

    Exactly, whatever the process umask: a permissive umask must not make it group or world
    writable, a strict one must not hide a file others must read (CDI specs, 0o644).
    """
    write_and_rename(path, data, mode=mode)
    fsync_dir(path.parent)


def temporary_path(path: Path) -> Path:
    """Where `path` is staged before its rename (`.<name>.tmp-<pid>`, beside it)."""
    return path.parent / f".{path.name}.tmp-{os.getpid()}"


def write_and_rename(path: Path, data: bytes, *, mode: int = 0o600, sync: bool = True) -> None:
    """`write_atomic` without the directory fsync, for callers that batch those: the content
    is durable, the rename is atomic but not yet durable.

    `sync=False` skips the content's fsync too: readers still see the old file or the new one,
    never a torn one, but after a power loss the file may be either, or empty. Only for
    records that nothing needs after a reboot."""
    tmp = temporary_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode & 0o700)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def make_dirs(path: Path, *, mode: int) -> None:
    """Create `path` and its missing parents, each with exactly `mode` whatever the umask.

    Directories that already exist are left alone: a shared parent such as /var/run/cdi or
    the kubelet's plugin dir is not ours to change. A directory another process creates at
    the same moment (a rolling-update sibling) is fine.
    """
    missing: list[Path] = []
    current = path
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)
        except FileExistsError:
            continue
        # mkdir's mode passes through the umask: it can only come out stricter, never looser.
        os.chmod(directory, mode)


def remove(path: Path) -> bool:
    """Remove `path` durably; returns False when it did not exist."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
    return True


def remove_temporaries(path: Path, *, older_than_s: float = 0.0) -> list[Path]:
    """Remove the temp files that writers of `path` killed mid-write left (`.<name>.tmp-<pid>`).

    Only safe when no write of `path` is in flight, or with `older_than_s` well above the few
    milliseconds one write takes. Returns what was removed.
    """
    deadline = time.time() - older_than_s
    removed: list[Path] = []
    for temporary in path.parent.glob(f".{path.name}.tmp-*"):
        try:
            stale = older_than_s <= 0 or temporary.stat().st_mtime < deadline
        except FileNotFoundError:
            continue
        if stale and remove(temporary):
            removed.append(temporary)
    return sorted(removed)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
