"""Group commit on a real directory: concurrent replacements share directory fsyncs, and none
returns before an fsync that began after its rename."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path

import pytest

from services.allocation.claim.group_commit import DirectoryGroupCommit
from shared import atomicfile
from shared.atomicfile import temporary_path


class RecordingFsync:
    """A real directory fsync that records, for each one, the directory's entries (with their
    inode) at the moment it began: what its fsync made durable."""

    def __init__(self, *, fail_first: int = 0) -> None:
        self.covered: list[set[tuple[str, int]]] = []
        self.fail_first = fail_first
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, directory: Path) -> None:
        with self._lock:
            self.calls += 1
            if self.calls <= self.fail_first:
                raise OSError(errno.EIO, "Input/output error")
            snapshot = {(e.name, e.inode()) for e in os.scandir(directory)}
        atomicfile.fsync_dir(directory)
        with self._lock:
            self.covered.append(snapshot)

    def durable(self, path: Path) -> bool:
        """Whether a finished fsync began while `path` (this very inode) was in place."""
        entry = (path.name, path.stat().st_ino)
        with self._lock:
            return any(entry in snapshot for snapshot in self.covered)


async def test_concurrent_replacements_share_fsyncs_and_each_is_durable_when_it_returns(
    tmp_path: Path,
):
    fsync = RecordingFsync()
    commit = DirectoryGroupCommit(tmp_path, store="test", fsync_dir=fsync)

    async def write(i: int) -> bool:
        path = tmp_path / f"claim-{i}.json"
        await commit.replace(path, f'{{"n": {i}}}'.encode())
        return fsync.durable(path)  # checked the moment the caller is resumed

    durable_on_return = await asyncio.gather(*(write(i) for i in range(100)))
    assert all(durable_on_return)
    assert commit.commits == 100
    assert 1 <= commit.directory_fsyncs < 100
    assert sorted(os.listdir(tmp_path)) == sorted(f"claim-{i}.json" for i in range(100))
    assert (tmp_path / "claim-7.json").read_bytes() == b'{"n": 7}'
    assert (tmp_path / "claim-7.json").stat().st_mode & 0o777 == 0o600


async def test_a_replacement_of_an_existing_file_is_atomic_and_leaves_no_temporary(
    tmp_path: Path,
):
    commit = DirectoryGroupCommit(tmp_path, store="test")
    path = tmp_path / "claim.json"
    await commit.replace(path, b"old")
    await commit.replace(path, b"new", mode=0o640)
    assert path.read_bytes() == b"new"
    assert path.stat().st_mode & 0o777 == 0o640
    assert not temporary_path(path).exists()
    assert temporary_path(path).name == f".claim.json.tmp-{os.getpid()}"


async def test_removals_are_durable_and_a_missing_file_needs_no_fsync(tmp_path: Path):
    fsync = RecordingFsync()
    commit = DirectoryGroupCommit(tmp_path, store="test", fsync_dir=fsync)
    path = tmp_path / "claim.json"
    await commit.replace(path, b"{}")
    assert await commit.remove(path)
    assert not path.exists()
    calls = fsync.calls
    assert not await commit.remove(path)
    assert fsync.calls == calls


async def test_a_failed_fsync_fails_its_batch_and_the_next_batch_succeeds(tmp_path: Path):
    fsync = RecordingFsync(fail_first=1)
    commit = DirectoryGroupCommit(tmp_path, store="test", fsync_dir=fsync)
    outcomes = await asyncio.gather(
        *(commit.replace(tmp_path / f"c{i}.json", b"{}") for i in range(5)),
        return_exceptions=True,
    )
    failed = [o for o in outcomes if isinstance(o, OSError)]
    assert failed  # the first batch: its renames are not known to be durable
    assert all(o.errno == errno.EIO and o.filename == str(tmp_path) for o in failed)
    assert len({id(o) for o in failed}) == len(failed)
    await commit.replace(tmp_path / "later.json", b"{}")
    assert fsync.durable(tmp_path / "later.json")


async def test_a_cancelled_writer_does_not_disturb_the_others(tmp_path: Path):
    fsync = RecordingFsync()
    commit = DirectoryGroupCommit(tmp_path, store="test", fsync_dir=fsync)
    doomed = asyncio.ensure_future(commit.replace(tmp_path / "doomed.json", b"{}"))
    others = [
        asyncio.ensure_future(commit.replace(tmp_path / f"c{i}.json", b"{}")) for i in range(3)
    ]
    await asyncio.sleep(0)
    doomed.cancel()
    await asyncio.gather(*others)
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert all(fsync.durable(tmp_path / f"c{i}.json") for i in range(3))


@pytest.mark.parametrize("umask", [0o077, 0o000])
async def test_a_file_gets_exactly_its_mode_whatever_the_umask(tmp_path: Path, umask: int):
    commit = DirectoryGroupCommit(tmp_path, store="test")
    previous = os.umask(umask)
    try:
        await commit.replace(tmp_path / "spec.json", b"{}", mode=0o644)
        await commit.replace(tmp_path / "claim.json", b"{}")
    finally:
        os.umask(previous)
    assert (tmp_path / "spec.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "claim.json").stat().st_mode & 0o777 == 0o600


async def test_a_lone_writer_pays_one_fsync_per_change_and_is_durable_on_return(tmp_path: Path):
    fsync = RecordingFsync()
    commit = DirectoryGroupCommit(tmp_path, store="test", fsync_dir=fsync)
    for i in range(5):
        path = tmp_path / f"claim-{i}.json"
        await commit.replace(path, b"{}")
        assert fsync.durable(path)
    assert await commit.remove(tmp_path / "claim-0.json")
    assert fsync.calls == commit.directory_fsyncs == commit.commits == 6


async def test_a_lone_writers_failed_fsync_names_the_directory(tmp_path: Path):
    commit = DirectoryGroupCommit(tmp_path, store="test", fsync_dir=RecordingFsync(fail_first=1))
    with pytest.raises(OSError, match="Input/output error") as caught:
        await commit.replace(tmp_path / "claim.json", b"{}")
    assert (caught.value.errno, caught.value.filename) == (errno.EIO, str(tmp_path))
    await commit.replace(tmp_path / "claim.json", b"{}")
    assert commit.commits == 1
