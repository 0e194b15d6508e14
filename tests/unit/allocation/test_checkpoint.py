"""Checkpoint files: round trip per version, corrupt files quarantined, foreign versions kept."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.allocation.claim import checkpoint
from services.allocation.claim.checkpoint import (
    CheckpointStore,
    ClaimState,
    PreparedClaim,
    PreparedDevice,
)
from shared.errors import CheckpointCorruptError

DRIVER = "sim.dra-suite.io"


def new_uid() -> str:
    return str(uuid.uuid4())


def _record(uid: str, *, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> PreparedClaim:
    return PreparedClaim(
        uid=uid,
        namespace="default",
        name="claim-a",
        driver=DRIVER,
        state=state,
        devices=(
            PreparedDevice(
                request_names=("req",),
                pool="node-a",
                device="npu-0",
                cdi_device_ids=(f"k8s.{DRIVER}/claim={uid}-npu-0",),
            ),
            PreparedDevice(
                request_names=("mem",),
                pool="node-a",
                device="gpu-1",
                cdi_device_ids=(f"k8s.{DRIVER}/claim={uid}-gpu-1-s1",),
                share_id="s1",
            ),
        ),
        cdi_spec={"cdiVersion": "0.5.0", "kind": f"k8s.{DRIVER}/claim", "devices": []},
    )


def _rewrite(path: Path, change: Callable[[dict[str, Any]], object]) -> None:
    document = json.loads(path.read_bytes())
    change(document)
    path.write_text(json.dumps(document))


def test_v1_record_round_trips_through_bytes(tmp_path):
    record = _record(new_uid())
    assert checkpoint.decode(checkpoint.encode(record), path=tmp_path / "x.json") == record


def test_v1_document_is_versioned_and_checksummed():
    document = json.loads(checkpoint.encode(_record(new_uid())))
    assert document["apiVersion"] == "dra-suite.io/v1"
    assert document["kind"] == "PreparedClaim"
    assert document["checksum"].startswith("sha256:")


def test_a_newer_v1_writer_with_extra_fields_is_read(tmp_path):
    """Additive change within v1: unknown fields are covered by the checksum and ignored."""
    record = _record(new_uid())
    document = json.loads(checkpoint.encode(record))
    document["futureField"] = {"added": "later"}
    document["checksum"] = checkpoint._checksum(document)
    assert checkpoint.decode(json.dumps(document).encode(), path=tmp_path / "x.json") == record


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],
        lambda data: data.replace(b'"npu-0"', b'"npu-9"'),
        lambda data: b"[]",
        lambda data: json.dumps({"apiVersion": "dra-suite.io/v1", "checksum": "x"}).encode(),
    ],
    ids=["truncated", "edited-without-checksum", "not-an-object", "missing-fields"],
)
def test_damaged_files_are_reported_corrupt(tmp_path, damage):
    data = damage(checkpoint.encode(_record(new_uid())))
    with pytest.raises(CheckpointCorruptError):
        checkpoint.decode(data, path=tmp_path / "x.json")


async def test_store_persists_records_across_instances(tmp_path):
    uid = new_uid()
    store = CheckpointStore(tmp_path)
    store.load()
    await store.put(_record(uid))
    reloaded = CheckpointStore(tmp_path)
    assert reloaded.load() == [_record(uid)]
    assert (tmp_path / f"{uid}.json").stat().st_mode & 0o777 == 0o600


async def test_a_record_not_durable_is_written_atomically_without_a_directory_fsync(tmp_path):
    uid = new_uid()
    store = CheckpointStore(tmp_path)
    store.load()
    await store.put(_record(uid, state=ClaimState.PREPARE_STARTED), durable=False)
    assert store.commit.commits == 0
    assert CheckpointStore(tmp_path).load() == [_record(uid, state=ClaimState.PREPARE_STARTED)]
    assert (tmp_path / f"{uid}.json").stat().st_mode & 0o777 == 0o600
    await store.put(_record(uid))
    assert store.commit.commits == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{uid}.json"]


async def test_store_delete_is_idempotent(tmp_path):
    uid = new_uid()
    store = CheckpointStore(tmp_path)
    store.load()
    await store.put(_record(uid))
    await store.delete(uid)
    await store.delete(uid)
    assert store.get(uid) is None
    assert list(tmp_path.iterdir()) == []


async def test_store_keeps_nothing_of_a_deleted_claim(tmp_path):
    """A long-running agent sees millions of claims: none may leave state behind."""
    store = CheckpointStore(tmp_path)
    store.load()
    for _ in range(50):
        uid = new_uid()
        await store.put(_record(uid, state=ClaimState.PREPARE_STARTED))
        await store.put(_record(uid))
        await store.delete(uid)
    assert not store.writes
    assert store.load() == []


async def test_uids_named_follows_every_incarnation_of_a_claim(tmp_path):
    old, new, other = new_uid(), new_uid(), new_uid()
    store = CheckpointStore(tmp_path)
    store.load()
    await store.put(_record(old))
    await store.put(_record(new, state=ClaimState.PREPARE_STARTED))
    await store.put(dataclasses.replace(_record(other), name="claim-b"))
    assert store.uids_named("default", "claim-a") == sorted([old, new])
    assert store.uids_named("default", "claim-b") == [other]
    assert store.uids_named("other", "claim-a") == []
    await store.delete(old)
    assert store.uids_named("default", "claim-a") == [new]
    reloaded = CheckpointStore(tmp_path)
    reloaded.load()
    assert reloaded.uids_named("default", "claim-b") == [other]


async def test_corrupt_file_is_quarantined_and_the_rest_loads(tmp_path):
    good, bad = new_uid(), new_uid()
    store = CheckpointStore(tmp_path)
    store.load()
    await store.put(_record(good))
    await store.put(_record(bad))
    _rewrite(tmp_path / f"{bad}.json", lambda d: d["metadata"].update(name="edited"))
    reloaded = CheckpointStore(tmp_path)
    assert [r.uid for r in reloaded.load()] == [good]
    assert (tmp_path / f"{bad}.json.corrupt").exists()
    assert not (tmp_path / f"{bad}.json").exists()


async def test_file_of_an_unknown_api_version_is_left_in_place(tmp_path):
    uid = new_uid()
    store = CheckpointStore(tmp_path)
    store.load()
    await store.put(_record(uid))
    _rewrite(tmp_path / f"{uid}.json", lambda d: d.update(apiVersion="dra-suite.io/v2"))
    assert CheckpointStore(tmp_path).load() == []
    assert (tmp_path / f"{uid}.json").exists()


def test_sync_sees_records_written_and_removed_by_another_instance(tmp_path):
    mine, theirs = CheckpointStore(tmp_path), CheckpointStore(tmp_path)
    mine.load()
    theirs.load()
    uid = new_uid()
    asyncio.run(theirs.put(_record(uid)))
    assert mine.get(uid) is None
    mine.sync()
    assert mine.get(uid) == _record(uid)
    assert mine.uids_named("default", "claim-a") == [uid]
    asyncio.run(theirs.delete(uid))
    mine.sync()
    assert mine.get(uid) is None
    assert mine.uids_named("default", "claim-a") == []


def test_leftover_temporary_files_are_removed(tmp_path):
    store = CheckpointStore(tmp_path)
    store.load()
    leftover = tmp_path / f".{new_uid()}.json.tmp-4242"
    leftover.write_bytes(b"{")
    assert store.remove_temporaries() == [leftover]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("uid", "safe"),
    [
        ("0f5a9d1e-2b3c-4d5e-8f60-718293a4b5c6", True),
        ("a" * 128, True),
        ("0f5a9d1e-2b3c-4d5e-8f60-718293a4b5c6\n", False),
        ("a" * 129, False),
        ("-leading-dash", False),
        ("../etc", False),
        ("", False),
    ],
    ids=["rfc4122", "longest", "trailing-newline", "too-long", "leading-dash", "path", "empty"],
)
def test_safe_uid_accepts_whole_names_only(uid, safe):
    assert checkpoint.safe_uid(uid) is safe
