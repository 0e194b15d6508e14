"""Faults of the checkpoint directory for the reliability tests: a full disk, a non-directory.

`DiskFull` mounts a small tmpfs on the (still empty) directory and fills it; it needs mount
privileges (CAP_SYS_ADMIN) and skips the test without them. `NotADirectory` moves the
directory aside and puts a regular file in its place (permissions cannot be used: the tests
run as root). Each has `setup`, `apply`, `stored` (what the directory holds), `remove` (the
fault, not the directory) and `teardown`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["DiskFull", "NotADirectory"]

TMPFS_SIZE = "256k"


class DiskFull:
    """The checkpoint directory on a small tmpfs (mounted while still empty), then filled."""

    records_kept = True
    """The records written before the fault can still be read."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.filler = directory / "filler"
        self.os_error = os.strerror(errno.ENOSPC)

    def setup(self) -> None:
        mount = ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs"]
        if (
            shutil.which("mount") is None
            or subprocess.run(
                [*mount, str(self.directory)], capture_output=True, check=False
            ).returncode
        ):
            pytest.skip("mounting a tmpfs needs mount privileges (CAP_SYS_ADMIN)")

    def apply(self) -> None:
        # Unbuffered, so that the ENOSPC comes from a write and not from close().
        with self.filler.open("wb", buffering=0) as out, contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * 4096)
        assert shutil.disk_usage(self.directory).free < 4096

    def stored(self) -> list[str]:
        """What the checkpoint directory holds, less the filler."""
        return sorted(p.name for p in self.directory.iterdir() if p != self.filler)

    def remove(self) -> None:
        self.filler.unlink()

    def teardown(self) -> None:
        subprocess.run(["umount", "-l", str(self.directory)], check=False)


class NotADirectory:
    """The checkpoint directory moved aside and a regular file put in its place."""

    records_kept = False

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.saved = directory.with_name(directory.name + ".saved")
        self.os_error = os.strerror(errno.ENOTDIR)

    def setup(self) -> None:
        pass

    def apply(self) -> None:
        self.directory.rename(self.saved)
        self.directory.write_text("not a directory\n")

    def stored(self) -> list[str]:
        return sorted(p.name for p in self.saved.iterdir())

    def remove(self) -> None:
        self.directory.unlink()
        self.saved.rename(self.directory)

    def teardown(self) -> None:
        if self.saved.exists():
            self.remove()
