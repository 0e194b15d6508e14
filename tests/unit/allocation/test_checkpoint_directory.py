"""The checkpoint directory deleted under a running agent (or before a restart).

A repeated prepare is never answered from memory without its record on disk; a vanished
directory is made again on the next write, with every record the agent holds; a restart that
finds the directory gone keeps the CDI specs of claims the kubelet believes prepared; and the
liveness check reports a directory that cannot be used.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from services.allocation.cdi import spec_files
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore, ClaimState
from services.allocation.claim.claims import ClaimReader, ClaimRef
from services.allocation.dra.preparer import ClaimPreparer
from shared.errors import ClaimError
from tests.fakes.allocation_sources import FakeInventory

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


def _preparer(base: Path, kube: Any, inventory: Any) -> tuple[ClaimPreparer, CheckpointStore]:
    checkpoints = CheckpointStore(base / "checkpoint")
    checkpoints.load()
    writer = CDIWriter(base / "cdi", driver=DRIVER)
    writer.prepare_root()
    preparer = ClaimPreparer(
        claims=ClaimReader(kube, driver=DRIVER, pool=NODE),
        inventory=FakeInventory(inventory),
        checkpoints=checkpoints,
        cdi_writer=writer,
        driver=DRIVER,
        backend="sim",
    )
    return preparer, checkpoints


def _claim(kube_reader, make_claim, device: str, name: str) -> ClaimRef:
    uid = str(uuid.uuid4())
    kube_reader.put(make_claim(uid=uid, name=name, devices=[device]))
    return ClaimRef("default", name, uid)


async def test_a_repeat_prepare_after_the_directory_vanished_writes_its_record_again(
    tmp_path, kube_reader, make_claim, make_inventory
):
    preparer, checkpoints = _preparer(tmp_path, kube_reader, make_inventory("npu-0", "npu-1"))
    first = _claim(kube_reader, make_claim, "npu-0", "first")
    second = _claim(kube_reader, make_claim, "npu-1", "second")
    answers = [await preparer.prepare(first), await preparer.prepare(second)]
    shutil.rmtree(checkpoints.directory)

    assert await preparer.prepare(first) == answers[0]
    # Both records are back: the directory was made again with everything the agent holds.
    assert sorted(p.name for p in checkpoints.directory.iterdir()) == sorted(
        [f"{first.uid}.json", f"{second.uid}.json"]
    )
    reloaded = CheckpointStore(checkpoints.directory)
    assert {r.uid: r.state for r in reloaded.load()} == {
        first.uid: ClaimState.PREPARE_COMPLETED,
        second.uid: ClaimState.PREPARE_COMPLETED,
    }


async def test_a_new_prepare_after_the_directory_vanished_succeeds(
    tmp_path, kube_reader, make_claim, make_inventory
):
    preparer, checkpoints = _preparer(tmp_path, kube_reader, make_inventory("npu-0", "npu-1"))
    await preparer.prepare(_claim(kube_reader, make_claim, "npu-0", "first"))
    shutil.rmtree(checkpoints.directory)
    new = _claim(kube_reader, make_claim, "npu-1", "new")
    outcomes = await preparer.prepare_batch([new])
    assert not isinstance(outcomes[new.uid], ClaimError), outcomes[new.uid]
    assert (checkpoints.directory / f"{new.uid}.json").exists()


async def test_a_repeat_prepare_whose_record_cannot_be_written_again_fails(
    tmp_path, kube_reader, make_claim, make_inventory
):
    preparer, checkpoints = _preparer(tmp_path, kube_reader, make_inventory("npu-0"))
    claim = _claim(kube_reader, make_claim, "npu-0", "first")
    await preparer.prepare(claim)
    shutil.rmtree(checkpoints.directory)
    checkpoints.directory.write_text("not a directory\n")
    outcomes = await preparer.prepare_batch([claim])
    assert isinstance(outcomes[claim.uid], ClaimError)
    assert "checkpoint" in str(outcomes[claim.uid])


async def test_a_restart_without_the_directory_keeps_the_specs_of_prepared_claims(
    tmp_path, kube_reader, make_claim, make_inventory
):
    preparer, checkpoints = _preparer(tmp_path, kube_reader, make_inventory("npu-0"))
    claim = _claim(kube_reader, make_claim, "npu-0", "first")
    await preparer.prepare(claim)
    shutil.rmtree(checkpoints.directory)

    restarted, _ = _preparer(tmp_path, kube_reader, make_inventory("npu-0"))
    await restarted.recover()
    assert (tmp_path / "cdi" / spec_files.spec_file_name(DRIVER, claim.uid)).exists()
    # The kubelet's unprepare still removes it.
    await restarted.unprepare(claim)
    assert not (tmp_path / "cdi" / spec_files.spec_file_name(DRIVER, claim.uid)).exists()


async def test_orphan_specs_are_still_removed_when_the_directory_was_there(
    tmp_path, kube_reader, make_claim, make_inventory
):
    preparer, checkpoints = _preparer(tmp_path, kube_reader, make_inventory("npu-0"))
    claim = _claim(kube_reader, make_claim, "npu-0", "first")
    await preparer.prepare(claim)
    (checkpoints.directory / f"{claim.uid}.json").unlink()
    restarted, _ = _preparer(tmp_path, kube_reader, make_inventory("npu-0"))
    await restarted.recover()
    assert not (tmp_path / "cdi" / spec_files.spec_file_name(DRIVER, claim.uid)).exists()


async def test_the_usability_check_makes_a_vanished_directory_and_reports_an_unusable_one(
    tmp_path, kube_reader, make_claim, make_inventory
):
    preparer, checkpoints = _preparer(tmp_path, kube_reader, make_inventory("npu-0"))
    claim = _claim(kube_reader, make_claim, "npu-0", "first")
    await preparer.prepare(claim)
    assert await checkpoints.unusable() is None

    shutil.rmtree(checkpoints.directory)
    assert await checkpoints.unusable() is None
    assert (checkpoints.directory / f"{claim.uid}.json").exists()

    shutil.rmtree(checkpoints.directory)
    checkpoints.directory.write_text("not a directory\n")
    reason = await checkpoints.unusable()
    assert reason is not None
    assert str(checkpoints.directory) in reason
