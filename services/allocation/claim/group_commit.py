"""Group commit for one directory: durable file replacements that share directory fsyncs.

A file replaced by write, fsync and rename is durable only once its directory is fsynced too.
Done per write (`atomicfile.write_atomic`), concurrent writers of different files each pay one
directory fsync. Here each writer writes, fsyncs and renames its own file, then waits for a
directory fsync that began after its rename: one fsync covers every rename finished before it
started. Writers that arrive while an fsync runs wait for the next one, because the running one
may have begun before their rename. A writer is resumed only after the fsync that covers it, so
a caller that returns holds exactly the guarantee `write_atomic` gives.

Directory fsyncs run on a thread of their own: in the shared default executor they would queue
behind every file write of a burst, and every writer would be resumed only at its end.

A writer that finds no other change in flight has nobody to share an fsync with: it writes,
renames and fsyncs the directory in one trip to a worker thread, as `write_atomic` does, and
spares the latency of a second thread hop on the path of a lone prepare. Writers that arrive
while it runs take the shared path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from shared import atomicfile, metrics
from shared.daemon_pool import DaemonThreadPool

__all__ = ["DirectoryGroupCommit"]

# A daemon thread: a directory fsync stuck on a failing disk must not hold the process at exit.
_fsync_thread = DaemonThreadPool(max_workers=1, thread_name_prefix="group-commit")
_meter = metrics.meter(__name__)
_commits = _meter.create_counter(
    "dra_group_commit_changes",
    unit="1",
    description="File replacements and removals made durable, per store.",
)
_fsyncs = _meter.create_counter(
    "dra_group_commit_directory_fsyncs",
    unit="1",
    description="Directory fsyncs that made them durable (shared by concurrent changes).",
)


class DirectoryGroupCommit:
    """`await commit.replace(path, data)`: `path` (in `directory`) holds `data`, durably."""

    def __init__(
        self,
        directory: Path,
        *,
        store: str,
        fsync_dir: Callable[[Path], None] = atomicfile.fsync_dir,
    ) -> None:
        """`store` names what the directory holds in metrics (`checkpoint`); `fsync_dir`
        runs in a worker thread (tests pass a recording one)."""
        self.directory = directory
        self._fsync_dir = fsync_dir
        self._store = store
        self._labels = {"store": store}
        self.directory_fsyncs = 0
        """Directory fsyncs done so far (fewer than commits when writers were concurrent)."""
        self.commits = 0
        """Replacements and removals made durable so far."""
        self._waiting: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._in_flight = 0

    async def replace(self, path: Path, data: bytes, *, mode: int = 0o600) -> None:
        """Replace `path` with `data` atomically; return once the rename is durable."""
        with self._change() as alone:
            if alone:
                await asyncio.to_thread(self._replace_alone, path, data, mode)
                self._count_alone()
                return
            await asyncio.to_thread(atomicfile.write_and_rename, path, data, mode=mode)
            await self._covered()

    async def remove(self, path: Path) -> bool:
        """Remove `path`; return once the removal is durable. False when it did not exist."""
        with self._change() as alone:
            if alone:
                removed = await asyncio.to_thread(self._remove_alone, path)
                if removed:
                    self._count_alone()
                return removed
            if not await asyncio.to_thread(_unlink, path):
                return False
            await self._covered()
            return True

    @contextlib.contextmanager
    def _change(self) -> Iterator[bool]:
        """One change in flight for its duration; True when no other change (nor a shared
        fsync) was in flight as it began."""
        alone = self._in_flight == 0 and self._flusher is None
        self._in_flight += 1
        try:
            yield alone
        finally:
            self._in_flight -= 1

    def _replace_alone(self, path: Path, data: bytes, mode: int) -> None:
        atomicfile.write_and_rename(path, data, mode=mode)
        self._fsync_directory()

    def _remove_alone(self, path: Path) -> bool:
        if not _unlink(path):
            return False
        self._fsync_directory()
        return True

    def _fsync_directory(self) -> None:
        """The directory fsync of a lone writer; its error names the directory, as a shared
        fsync's does."""
        try:
            self._fsync_dir(self.directory)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(self.directory)) from exc

    def _count_alone(self) -> None:
        self.directory_fsyncs += 1
        self.commits += 1
        _fsyncs.add(1, self._labels)
        _commits.add(1, self._labels)

    async def _covered(self) -> None:
        """Wait for a directory fsync that starts after this call."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(), name=f"group-commit-{self._store}")
        await waiter
        self.commits += 1
        _commits.add(1, self._labels)

    async def _flush(self) -> None:
        """Fsync the directory while anyone waits; each fsync settles the waiters before it."""
        batch: list[asyncio.Future[None]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    await asyncio.get_running_loop().run_in_executor(
                        _fsync_thread, self._fsync_dir, self.directory
                    )
                except OSError as exc:
                    _settle(batch, exc, directory=self.directory)
                else:
                    self.directory_fsyncs += 1
                    _fsyncs.add(1, self._labels)
                    _settle(batch, None, directory=self.directory)
                batch = []
        finally:
            # Only reached with waiters left when this task is cancelled (the loop is closing):
            # nobody may wait for an fsync that will not come.
            for waiter in [*batch, *self._waiting]:
                waiter.cancel()
            self._waiting = []
            self._flusher = None


def _settle(waiters: list[asyncio.Future[None]], error: OSError | None, *, directory: Path) -> None:
    for waiter in waiters:
        if waiter.done():  # its caller was cancelled meanwhile
            continue
        if error is None:
            waiter.set_result(None)
        else:
            # One exception object each: raised in several tasks, one would collect all their
            # tracebacks. OSError(errno, ...) picks the subclass (PermissionError, ...) itself.
            waiter.set_exception(OSError(error.errno, error.strerror, str(directory)))


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
