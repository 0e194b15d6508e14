"""ClaimPreparer: pure planning, idempotent prepare, per-claim failures, unprepare, recovery."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.allocation.cdi import spec_files
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore, ClaimState
from services.allocation.claim.claims import (
    AllocatedClaim,
    ClaimReader,
    ClaimRef,
    DeviceResult,
    OpaqueConfig,
)
from services.allocation.dra import preparer
from services.allocation.dra.preparer import ClaimPreparer
from shared.errors import ClaimError, DeviceNotAllocatableError, InvalidOpaqueConfigError
from tests.fakes.allocation_sources import FakeInventory

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


def new_uid() -> str:
    return str(uuid.uuid4())


@dataclass
class Rig:
    preparer: ClaimPreparer
    kube: Any
    inventory: FakeInventory
    checkpoints: CheckpointStore
    cdi_root: Path

    def spec(self, uid: str) -> dict[str, Any]:
        spec: dict[str, Any] = json.loads(
            (self.cdi_root / spec_files.spec_file_name(DRIVER, uid)).read_text()
        )
        return spec

    def restarted(self) -> Rig:
        """A fresh preparer over the same directories (an agent restart)."""
        return _rig(self.cdi_root.parent, kube=self.kube, inv=self.inventory)


@pytest.fixture
def rig(tmp_path, kube_reader, make_inventory) -> Rig:
    """A preparer over tmp dirs, the fake kube reader and devices npu-0..2."""
    return _rig(
        tmp_path, kube=kube_reader, inv=FakeInventory(make_inventory("npu-0", "npu-1", "npu-2"))
    )


def _rig(
    tmp_path: Path,
    *,
    kube: Any,
    inv: FakeInventory,
    cdi_root: Path | None = None,
    replaced_wait_s: float = 5.0,
    inventory_wait_s: float = 10.0,
) -> Rig:
    checkpoints = CheckpointStore(tmp_path / "checkpoint")
    checkpoints.load()
    root = cdi_root or tmp_path / "cdi"
    root.mkdir(exist_ok=True)
    prep = ClaimPreparer(
        claims=ClaimReader(kube, driver=DRIVER, pool=NODE),
        inventory=inv,
        checkpoints=checkpoints,
        cdi_writer=CDIWriter(root, driver=DRIVER),
        driver=DRIVER,
        backend="sim",
        replaced_claim_wait_s=replaced_wait_s,
        inventory_wait_s=inventory_wait_s,
    )
    return Rig(prep, kube, inv, checkpoints, root)


def _ref(uid: str, name: str = "claim-a") -> ClaimRef:
    return ClaimRef(namespace="default", name=name, uid=uid)


def _allocated(uid: str, *devices: tuple[str, str]) -> AllocatedClaim:
    return AllocatedClaim(
        ref=_ref(uid),
        results=tuple(DeviceResult(request=r, pool=NODE, device=d) for r, d in devices),
    )


# Planning (pure)


def test_plan_names_cdi_devices_after_the_claim_uid(make_inventory):
    uid = new_uid()
    record = preparer.plan(
        _allocated(uid, ("req", "npu-0"), ("req", "npu-1")),
        make_inventory("npu-0", "npu-1"),
        driver=DRIVER,
        backend="sim",
    )
    assert record.state is ClaimState.PREPARE_STARTED
    assert [(d.request_names, d.device, d.cdi_device_ids) for d in record.devices] == [
        (("req",), "npu-0", (f"k8s.{DRIVER}/claim={uid}-npu-0",)),
        (("req",), "npu-1", (f"k8s.{DRIVER}/claim={uid}-npu-1",)),
    ]
    assert record.cdi_spec is not None
    assert spec_files.validate(record.cdi_spec) == []
    assert [d["name"] for d in record.cdi_spec["devices"]] == [f"{uid}-npu-0", f"{uid}-npu-1"]


def test_plan_merges_env_over_the_devices_of_one_request(make_inventory):
    uid = new_uid()
    record = preparer.plan(
        _allocated(uid, ("a", "npu-0"), ("a", "npu-1"), ("b", "npu-2")),
        make_inventory("npu-0", "npu-1", "npu-2"),
        driver=DRIVER,
        backend="sim",
    )
    assert record.cdi_spec is not None
    envs = [d["containerEdits"]["env"] for d in record.cdi_spec["devices"]]
    assert (
        envs[0]
        == envs[1]
        == [
            "ASCEND_VISIBLE_DEVICES=0,1",
            f"DRA_SUITE_CLAIM_UID={uid}",
            "DRA_SUITE_DEVICES=npu-0,npu-1",
        ]
    )
    assert envs[2] == [
        "ASCEND_VISIBLE_DEVICES=2",
        f"DRA_SUITE_CLAIM_UID={uid}",
        "DRA_SUITE_DEVICES=npu-2",
    ]
    assert record.cdi_spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/davinci0", "hostPath": "/dev/null"}
    ]


@pytest.mark.parametrize(
    "devices",
    [("npu-1",), None],
    ids=["device-not-in-inventory", "no-inventory-yet"],
)
def test_plan_rejects_devices_missing_from_the_inventory(make_inventory, devices):
    inv = None if devices is None else make_inventory(*devices)
    with pytest.raises(DeviceNotAllocatableError, match="device npu-0 is not in the inventory"):
        preparer.plan(_allocated(new_uid(), ("req", "npu-0")), inv, driver=DRIVER, backend="sim")


def test_plan_of_a_claim_without_our_devices_writes_no_spec(make_inventory):
    record = preparer.plan(
        _allocated(new_uid()), make_inventory("npu-0"), driver=DRIVER, backend="sim"
    )
    assert record.devices == ()
    assert record.cdi_spec is None


# Prepare


async def test_prepare_writes_the_spec_and_a_completed_checkpoint(rig, make_claim):
    uid = new_uid()
    rig.kube.put(make_claim(uid=uid, devices=["npu-0", "npu-2"]))
    record = await rig.preparer.prepare(_ref(uid))
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert [d["name"] for d in rig.spec(uid)["devices"]] == [f"{uid}-npu-0", f"{uid}-npu-2"]
    assert rig.checkpoints.get(uid) == record


async def test_only_prepare_completed_of_a_claim_without_partitions_is_fsynced(rig, make_claim):
    """Its PrepareStarted guards only the CDI spec, which a reboot wipes anyway (see
    `ClaimPreparer._start`); both records are written, one durable change is waited for."""
    uid = new_uid()
    rig.kube.put(make_claim(uid=uid, devices=["npu-0"]))
    await rig.preparer.prepare(_ref(uid))
    assert rig.checkpoints.writes[(uid, ClaimState.PREPARE_STARTED)] == 1
    assert rig.checkpoints.writes[(uid, ClaimState.PREPARE_COMPLETED)] == 1
    assert rig.checkpoints.commit.commits == 1


async def test_a_new_claim_waits_for_the_first_inventory(
    tmp_path, kube_reader, make_claim, make_inventory
):
    """A fresh agent serves before discovery's inventory reached it: the prepare waits."""
    rig = _rig(tmp_path, kube=kube_reader, inv=FakeInventory(None))
    uid = new_uid()
    rig.kube.put(make_claim(uid=uid, devices=["npu-1"]))
    waiting = asyncio.create_task(rig.preparer.prepare(_ref(uid)))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    assert rig.kube.gets == 0  # nothing read, nothing written while it waits
    rig.inventory.current = make_inventory("npu-0", "npu-1")
    record = await asyncio.wait_for(waiting, 5)
    assert [d.device for d in record.devices] == ["npu-1"]


async def test_without_an_inventory_a_new_claim_fails_clearly_after_the_wait(
    tmp_path, kube_reader, make_claim
):
    rig = _rig(tmp_path, kube=kube_reader, inv=FakeInventory(None), inventory_wait_s=0.2)
    uid = new_uid()
    rig.kube.put(make_claim(uid=uid, devices=["npu-1"]))
    with pytest.raises(ClaimError, match="device inventory is not known yet"):
        await rig.preparer.prepare(_ref(uid))
    assert rig.checkpoints.get(uid) is None


async def test_a_prepared_claim_is_answered_without_an_inventory(rig, make_claim):
    uid = new_uid()
    rig.kube.put(make_claim(uid=uid, devices=["npu-0"]))
    first = await rig.preparer.prepare(_ref(uid))
    rig.inventory.current = None
    assert await asyncio.wait_for(rig.preparer.prepare(_ref(uid)), 1) == first


async def test_repeat_prepare_returns_same_cdi_ids_without_reading_the_claim(
    rig, make_claim, make_inventory
):
    uid = new_uid()
    rig.kube.put(make_claim(uid=uid, devices=["npu-0"]))
    first = await rig.preparer.prepare(_ref(uid))
    rig.inventory.current = make_inventory("npu-7")  # the answer must not depend on it any more
    second = await rig.preparer.prepare(_ref(uid))
    assert second == first
    assert rig.kube.gets == 1


async def test_concurrent_prepares_of_one_claim_plan_once(rig, make_claim):
    uid = new_uid()
    rig.kube.put(make_claim(uid=uid, devices=["npu-1"]))
    answers = await asyncio.gather(*(rig.preparer.prepare(_ref(uid)) for _ in range(5)))
    assert all(answer == answers[0] for answer in answers)
    assert rig.kube.gets == 1


@pytest.mark.parametrize(
    ("bad_claim", "bad_uid", "error"),
    [
        ({"uid": "other", "name": "bad"}, True, "got replaced"),
        ({"name": "bad", "allocated": False}, True, "not allocated"),
        ({"name": "bad", "devices": ["npu-9"]}, True, "npu-9"),
        (None, True, "not found"),
        (None, False, "malformed uid"),
    ],
    ids=["uid-mismatch", "unallocated", "unknown-device", "missing-claim", "empty-uid"],
)
async def test_one_bad_claim_fails_alone_in_a_batch(rig, make_claim, bad_claim, bad_uid, error):
    good, bad = new_uid(), (new_uid() if bad_uid else "")
    rig.kube.put(make_claim(uid=good, devices=["npu-0"]))
    if bad_claim is not None:
        rig.kube.put(make_claim(**{"uid": bad, **bad_claim}))
    outcomes = await rig.preparer.prepare_batch([_ref(good), _ref(bad, name="bad")])
    assert not isinstance(outcomes[good], ClaimError)
    assert isinstance(outcomes[bad], ClaimError)
    assert error in str(outcomes[bad])
    assert rig.checkpoints.get(bad) is None
    assert not (rig.cdi_root / spec_files.spec_file_name(DRIVER, bad)).exists()


async def test_unexpected_errors_fail_the_whole_batch(tmp_path, make_inventory):
    class BrokenReader:
        async def get(self, *args: object, **kwargs: object) -> dict[str, Any]:
            raise RuntimeError("bug")

    rig = _rig(tmp_path, kube=BrokenReader(), inv=FakeInventory(make_inventory("npu-0")))
    with pytest.raises(RuntimeError, match="bug"):
        await rig.preparer.prepare_batch([_ref(new_uid())])


async def test_failed_cdi_write_is_the_claims_error_and_a_retry_finishes(
    tmp_path, kube_reader, make_claim, make_inventory
):
    uid = new_uid()
    kube_reader.put(make_claim(uid=uid, devices=["npu-0"]))
    root = tmp_path / "missing-cdi-root"
    inv = FakeInventory(make_inventory("npu-0"))
    rig = _rig(tmp_path, kube=kube_reader, inv=inv, cdi_root=root)
    root.rmdir()
    outcomes = await rig.preparer.prepare_batch([_ref(uid)])
    assert "writing CDI spec" in str(outcomes[uid])
    record = rig.checkpoints.get(uid)
    assert record is not None
    assert record.state is ClaimState.PREPARE_STARTED
    root.mkdir()
    rig.inventory.current = None  # the retry finishes the stored plan
    retried = await rig.preparer.prepare(_ref(uid))
    assert retried.state is ClaimState.PREPARE_COMPLETED
    assert retried.devices == record.devices
    assert rig.kube.gets == 1


async def test_recreated_claim_with_a_new_uid_gets_its_own_preparation_after_the_old_one(
    rig, make_claim
):
    old, new = new_uid(), new_uid()
    rig.kube.put(make_claim(uid=old, devices=["npu-0"]))
    first = await rig.preparer.prepare(_ref(old))
    await rig.preparer.unprepare(_ref(old))
    rig.kube.put(make_claim(uid=new, devices=["npu-1"]))
    second = await rig.preparer.prepare(_ref(new))
    assert second.devices[0].device == "npu-1"
    assert second.devices[0].cdi_device_ids != first.devices[0].cdi_device_ids
    assert {r.uid for r in rig.checkpoints.records()} == {new}


async def test_recreated_claim_fails_while_the_old_uid_stays_prepared(
    tmp_path, kube_reader, make_claim, make_inventory
):
    rig = _rig(
        tmp_path, kube=kube_reader, inv=FakeInventory(make_inventory("npu-0")), replaced_wait_s=0.1
    )
    old, new = new_uid(), new_uid()
    rig.kube.put(make_claim(uid=old))
    await rig.preparer.prepare(_ref(old))
    rig.kube.put(make_claim(uid=new))
    outcomes = await rig.preparer.prepare_batch([_ref(new)])
    assert str(outcomes[new]) == (
        f"claim default/claim-a: previous preparation {old} not yet unprepared"
    )
    assert rig.checkpoints.get(new) is None
    assert rig.kube.gets == 1, "the new claim must not even be read while the old one is prepared"


async def test_recreated_claim_waits_for_the_old_uids_unprepare(rig, make_claim):
    old, new = new_uid(), new_uid()
    rig.kube.put(make_claim(uid=old, devices=["npu-0"]))
    await rig.preparer.prepare(_ref(old))
    rig.kube.put(make_claim(uid=new, devices=["npu-0"]))
    waiting = asyncio.create_task(rig.preparer.prepare(_ref(new)))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await rig.preparer.unprepare(_ref(old))
    record = await asyncio.wait_for(waiting, 5)
    assert record.uid == new
    assert [r.uid for r in rig.checkpoints.records()] == [new]


# Unprepare and recovery


async def test_unprepare_removes_the_spec_and_the_checkpoint(rig, make_claim):
    uid = new_uid()
    rig.kube.put(make_claim(uid=uid))
    await rig.preparer.prepare(_ref(uid))
    assert await rig.preparer.unprepare_batch([_ref(uid)]) == {uid: None}
    assert rig.checkpoints.get(uid) is None
    assert list(rig.cdi_root.iterdir()) == []
    assert list(rig.checkpoints.directory.iterdir()) == []


async def test_unprepare_of_an_unknown_claim_succeeds(rig):
    uid = new_uid()
    assert await rig.preparer.unprepare_batch([_ref(uid)]) == {uid: None}


async def test_restart_keeps_prepared_claims_and_answers_the_same(rig, make_claim):
    uid = new_uid()
    rig.kube.put(make_claim(uid=uid, devices=["npu-0", "npu-1"]))
    first = await rig.preparer.prepare(_ref(uid))
    again = rig.restarted()
    await again.preparer.recover()
    assert await again.preparer.prepare(_ref(uid)) == first
    assert rig.kube.gets == 1


async def test_recover_rewrites_lost_specs_and_removes_orphans(rig, make_claim):
    uid, orphan = new_uid(), new_uid()
    rig.kube.put(make_claim(uid=uid))
    await rig.preparer.prepare(_ref(uid))
    spec = rig.spec(uid)
    (rig.cdi_root / spec_files.spec_file_name(DRIVER, uid)).unlink()
    (rig.cdi_root / spec_files.spec_file_name(DRIVER, orphan)).write_text("{}")
    again = rig.restarted()
    await again.preparer.recover()
    assert again.spec(uid) == spec
    assert CDIWriter(rig.cdi_root, driver=DRIVER).claim_uids() == [uid]


# Opaque configuration


def _sharing(sharing: dict[str, Any], *, source: str = "FromClaim", requests=()) -> dict[str, Any]:
    return {
        "source": source,
        "requests": list(requests),
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": f"{DRIVER}/v1alpha1",
                "kind": "DeviceConfig",
                "sharing": sharing,
            },
        },
    }


async def test_claim_config_shapes_the_cdi_env_and_is_stored(rig, make_claim):
    uid = new_uid()
    rig.kube.put(
        make_claim(
            uid=uid,
            devices=["npu-0", "npu-1"],
            config=[
                _sharing({"strategy": "TimeSlicing"}, source="FromClass", requests=["req"]),
                _sharing(
                    {
                        "strategy": "SpacePartitioning",
                        "spacePartitioning": {"computePercent": 30, "memoryLimit": "4Gi"},
                    }
                ),
            ],
        )
    )
    record = await rig.preparer.prepare(_ref(uid))
    for device in rig.spec(uid)["devices"]:
        env = device["containerEdits"]["env"]
        assert "DRA_SUITE_SHARING_STRATEGY=SpacePartitioning" in env
        assert "DRA_SUITE_COMPUTE_PERCENT=30" in env
        assert f"DRA_SUITE_MEMORY_LIMIT={4 * 2**30}" in env
        assert not [e for e in env if e.startswith(("CUDA_MPS", "DRA_SUITE_TIMESLICE"))]
    assert record.device_configs["req"]["sharing"]["strategy"] == "SpacePartitioning"
    assert rig.restarted().checkpoints.get(uid) == record


async def test_an_invalid_config_is_that_claims_error_naming_the_field(rig, make_claim):
    good, bad = new_uid(), new_uid()
    rig.kube.put(make_claim(uid=good))
    rig.kube.put(
        make_claim(
            uid=bad,
            name="bad",
            config=[_sharing({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Fast"}})],
        )
    )
    outcomes = await rig.preparer.prepare_batch([_ref(good), _ref(bad, name="bad")])
    assert not isinstance(outcomes[good], ClaimError)
    error = outcomes[bad]
    assert isinstance(error, InvalidOpaqueConfigError)
    assert error.field == "sharing.timeSlicing.interval"
    assert "sharing.timeSlicing.interval" in str(error)
    assert rig.checkpoints.get(bad) is None


async def test_configs_of_other_drivers_are_ignored(rig, make_claim):
    uid = new_uid()
    foreign = _sharing({"strategy": "Nonsense"})
    foreign["opaque"]["driver"] = "gpu.example.com"
    rig.kube.put(make_claim(uid=uid, config=[foreign]))
    record = await rig.preparer.prepare(_ref(uid))
    assert record.device_configs == {}


def test_nvidia_kind_devices_get_mps_limits(make_inventory):
    inventory = make_inventory("gpu-0", "gpu-1")
    for index, device in enumerate(inventory.devices):  # as the sim publishes its GPUs
        device.kind = "gpu"
        device.device_nodes[0].path = f"/dev/nvidia{index}"
        del device.env["ASCEND_VISIBLE_DEVICES"]
        device.env["NVIDIA_VISIBLE_DEVICES"] = str(index)
    claim = AllocatedClaim(
        ref=_ref("u-1"),
        results=(
            DeviceResult(request="req", pool=NODE, device="gpu-0"),
            DeviceResult(request="req", pool=NODE, device="gpu-1"),
        ),
        configs=(
            OpaqueConfig(
                source="FromClaim",
                requests=(),
                parameters=_sharing(
                    {
                        "strategy": "SpacePartitioning",
                        "spacePartitioning": {"computePercent": 50, "memoryLimit": "8Gi"},
                    }
                )["opaque"]["parameters"],
            ),
        ),
    )
    record = preparer.plan(claim, inventory, driver=DRIVER, backend="sim")
    assert record.cdi_spec is not None
    env = record.cdi_spec["devices"][0]["containerEdits"]["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M,1=8192M" in env
