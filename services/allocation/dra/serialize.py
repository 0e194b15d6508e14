"""Serialisation of prepare/unprepare across plugin instances during a rolling update.

Two instances of the plugin may serve the same node at once (docs/contracts.md §2.3); either may
get any
call, so they share the checkpoint and CDI root and take turns, as the Go helper does, with an
`fcntl.flock` on `<plugin data dir>/serialize.lock`. The flock is taken in a worker thread (the
event loop never blocks); inside one process an asyncio.Lock queues callers first, because a
second flock on the same open file would not block. Without rolling updates (`path=None`) the
lock is a no-op and the preparer's per-claim locks are all the serialisation there is.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path

import structlog

from shared.errors import ConfigError

__all__ = ["InstanceLock"]

log = structlog.get_logger(__name__)


class InstanceLock:
    """`async with lock.hold():` excludes every other holder on this node (all instances)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fd: int | None = None
        self._local = asyncio.Lock()

    @property
    def shared(self) -> bool:
        """True when other instances may change the checkpoint between two holds."""
        return self.path is not None

    def open(self) -> None:
        if self.path is None or self._fd is not None:
            return
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            message = f"serialize lock {self.path}: {exc}"
            raise ConfigError(message, field="plugin_data_dir") from exc
        log.info("instance_lock_opened", path=str(self.path))

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        if self.path is None:
            yield
            return
        if self._fd is None:
            self.open()
        fd = self._fd
        assert fd is not None
        async with self._local:
            await _flock(fd)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)


async def _flock(fd: int) -> None:
    """Take the flock in a thread; if cancelled meanwhile, release it once the thread has it."""
    taking = asyncio.ensure_future(asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX))
    try:
        await asyncio.shield(taking)
    except asyncio.CancelledError:
        # The thread cannot be interrupted: wait for it (the other instance's turn is short),
        # then give the lock back so that neither instance is stuck behind a lost holder.
        while not taking.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(taking)
        if taking.exception() is None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        raise
