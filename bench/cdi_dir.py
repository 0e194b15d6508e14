"""A CDI spec directory on tmpfs, as /var/run/cdi is on a real node."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["node_like_cdi_dir"]

_TMPFS = Path("/dev/shm")


@contextlib.contextmanager
def node_like_cdi_dir() -> Iterator[Path | None]:
    """A fresh directory under /dev/shm, removed afterwards; None where there is no tmpfs
    (the stack then keeps specs in its work dir, and the figures include their disk fsyncs)."""
    if not _TMPFS.is_dir():
        yield None
        return
    path = Path(tempfile.mkdtemp(prefix="dra-bench-cdi-", dir=_TMPFS))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
