"""Files and directories get exactly the mode asked for, whatever the process umask."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared import atomicfile


@pytest.fixture(params=[0o000, 0o022, 0o077], ids=lambda m: f"umask {m:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644])
def test_write_atomic_gives_exactly_the_mode(tmp_path, umask, mode):
    path = tmp_path / "record.json"
    atomicfile.write_atomic(path, b"{}", mode=mode)
    assert _mode(path) == mode
    atomicfile.write_atomic(path, b"{}", mode=mode)  # a replacement too
    assert _mode(path) == mode
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


@pytest.mark.parametrize("sync", [True, False])
def test_write_and_rename_replaces_whole_with_or_without_fsync(tmp_path, umask, sync):
    path = tmp_path / "record.json"
    atomicfile.write_and_rename(path, b"old", mode=0o640, sync=sync)
    atomicfile.write_and_rename(path, b"new" * 1000, mode=0o640, sync=sync)
    assert path.read_bytes() == b"new" * 1000
    assert _mode(path) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755])
def test_make_dirs_gives_every_created_directory_exactly_the_mode(tmp_path, umask, mode):
    leaf = tmp_path / "a" / "b" / "c"
    atomicfile.make_dirs(leaf, mode=mode)
    assert [_mode(d) for d in (tmp_path / "a", tmp_path / "a" / "b", leaf)] == [mode] * 3


def test_make_dirs_leaves_existing_directories_alone(tmp_path, umask):
    shared_parent = tmp_path / "cdi"
    shared_parent.mkdir()
    shared_parent.chmod(0o711)
    atomicfile.make_dirs(shared_parent / "ours", mode=0o700)
    atomicfile.make_dirs(shared_parent / "ours", mode=0o700)  # idempotent
    assert _mode(shared_parent) == 0o711
    assert _mode(shared_parent / "ours") == 0o700


def test_temporaries_of_killed_writers_are_removed_and_nothing_else(tmp_path):
    target = tmp_path / "state.json"
    atomicfile.write_atomic(target, b"{}")
    killed = [tmp_path / ".state.json.tmp-4242", tmp_path / ".state.json.tmp-17"]
    for path in killed:
        path.write_bytes(b"{")
    other = tmp_path / ".other.json.tmp-4242"
    other.write_bytes(b"{")
    assert atomicfile.remove_temporaries(target) == sorted(killed)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.json.tmp-4242", "state.json"]


def test_only_old_temporaries_go_when_a_writer_may_be_in_flight(tmp_path):
    target = tmp_path / "inventory.pb"
    old, fresh = tmp_path / ".inventory.pb.tmp-1", tmp_path / ".inventory.pb.tmp-2"
    old.write_bytes(b"x")
    fresh.write_bytes(b"x")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert atomicfile.remove_temporaries(target, older_than_s=60) == [old]
    assert fresh.exists()
