"""Device status on the claim (KEP-4817): this driver's `status.devices` entries, written in the
background after a prepare, kept current with the health board, removed after an unprepare,
never touching another driver's entries."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import uuid
from typing import Any

import pytest

from services.allocation.claim.checkpoint import (
    ClaimState,
    PreparedClaim,
    PreparedDevice,
    PreparedPartition,
)
from services.allocation.dra.hot_path import KubeletCalls
from services.allocation.node_view.health_board import HealthBoard
from services.allocation.status import entries
from services.allocation.status.publisher import DeviceStatusPublisher
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2
from tests.fakes.claim_status import FakeClaimStatusAPI

DRIVER = "sim.dra-suite.io"
OTHER = "nic.example.com"
NODE = "node-a"
T0 = 1_790_000_000.0


def _inventory() -> inventory_pb2.Inventory:
    gpu = inventory_pb2.Device(name="gpu-0", kind="gpu", uuid="GPU-0aa")
    gpu.attributes["resource.kubernetes.io/pciBusID"].string = "0000:40:00.0"
    gpu.attributes["numaNode"].int = 1
    mig = inventory_pb2.Device(name="gpu-1-mig-1g", kind="mig", parent="gpu-1")
    return inventory_pb2.Inventory(driver=DRIVER, node=NODE, pool=NODE, devices=[gpu, mig])


class _Inventory:
    current = _inventory()


def _record(
    uid: str, *devices: str, partitions: tuple[PreparedPartition, ...] = ()
) -> PreparedClaim:
    return PreparedClaim(
        uid=uid,
        namespace="default",
        name="claim-a",
        driver=DRIVER,
        state=ClaimState.PREPARE_COMPLETED,
        devices=tuple(
            PreparedDevice(request_names=("req",), pool=NODE, device=d, cdi_device_ids=())
            for d in devices
        ),
        partitions=partitions,
    )


def _claim(uid: str, *devices: str, others: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    results = [{"request": "req", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    results += [{"request": "nic", "driver": OTHER, "pool": NODE, "device": "eth1"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "claim-a", "namespace": "default", "uid": uid, "generation": 2},
        "status": {"allocation": {"devices": {"results": results}}, "devices": list(others)},
    }


NIC_ENTRY = {
    "driver": OTHER,
    "pool": NODE,
    "device": "eth1",
    "conditions": [],
    "networkData": {"interfaceName": "eth1"},
}


def _health(
    state: health_pb2.HealthState.ValueType, device: str = "gpu-0", message: str = ""
) -> health_pb2.DeviceHealth:
    return health_pb2.DeviceHealth(
        driver=DRIVER, node=NODE, device=device, state=state, message=message, updated_unix_ms=1
    )


def _conditions(entry: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in entry["conditions"]}


# Entries (pure)


def test_entries_carry_ready_health_and_the_devices_data():
    uid = str(uuid.uuid4())
    partition = PreparedPartition(device="gpu-1-mig-1g", profile="1g.10gb", partition_id="7")
    record = _record(uid, "gpu-0", "gpu-1-mig-1g", partitions=(partition,))
    board = HealthBoard(pool=NODE, clock=lambda: T0)
    board.set_devices(["gpu-0", "gpu-1-mig-1g"])
    board.put("gpu-0", _health(health_pb2.HEALTH_STATE_UNHEALTHY, message="XID 79"))
    health = {v.device: v for v in board.snapshot()}
    found = entries.entries(record, node=NODE, inventory=_inventory(), health=health)
    merged = entries.merge(
        _claim(uid, "gpu-0", "gpu-1-mig-1g"), found, driver=DRIVER, now="2026-01-01T00:00:00Z"
    )
    gpu, mig = merged
    assert (gpu["driver"], gpu["pool"], gpu["device"]) == (DRIVER, NODE, "gpu-0")
    assert _conditions(gpu) == {
        "Ready": ("True", "Prepared"),
        "Healthy": ("False", "DeviceUnhealthy"),
    }
    assert gpu["conditions"][1]["message"] == "XID 79"
    assert gpu["conditions"][0]["observedGeneration"] == 2
    assert gpu["data"] == {"uuid": "GPU-0aa", "pciBusID": "0000:40:00.0", "numaNode": 1}
    assert _conditions(mig)["Healthy"] == ("Unknown", "HealthUnknown")
    assert mig["data"] == {"parent": "gpu-1", "partition": {"id": "7", "profile": "1g.10gb"}}
    assert "networkData" not in gpu


def test_merge_keeps_other_drivers_entries_and_the_transition_time_of_unchanged_conditions():
    uid = str(uuid.uuid4())
    record = _record(uid, "gpu-0")
    healthy = {v.device: v for v in _board_with(health_pb2.HEALTH_STATE_HEALTHY).snapshot()}
    first = entries.merge(
        _claim(uid, "gpu-0", others=(NIC_ENTRY,)),
        entries.entries(record, node=NODE, inventory=_inventory(), health=healthy),
        driver=DRIVER,
        now="2026-01-01T00:00:00Z",
    )
    assert first[0] == NIC_ENTRY
    claim = _claim(uid, "gpu-0", others=tuple(first))
    unhealthy = {v.device: v for v in _board_with(health_pb2.HEALTH_STATE_UNHEALTHY).snapshot()}
    second = entries.merge(
        claim,
        entries.entries(record, node=NODE, inventory=_inventory(), health=unhealthy),
        driver=DRIVER,
        now="2026-01-02T00:00:00Z",
    )
    assert second[0] == NIC_ENTRY
    times = {c["type"]: c["lastTransitionTime"] for c in second[1]["conditions"]}
    assert times == {"Ready": "2026-01-01T00:00:00Z", "Healthy": "2026-01-02T00:00:00Z"}


def test_merge_leaves_out_devices_the_allocation_no_longer_names():
    uid = str(uuid.uuid4())
    found = entries.entries(_record(uid, "gpu-0"), node=NODE, inventory=None, health={})
    assert entries.merge(_claim(uid), found, driver=DRIVER, now="2026-01-01T00:00:00Z") == []


def _board_with(state: health_pb2.HealthState.ValueType) -> HealthBoard:
    board = HealthBoard(pool=NODE, clock=lambda: T0)
    board.set_devices(["gpu-0"])
    board.put("gpu-0", _health(state))
    return board


# The publisher


class _Rig:
    def __init__(self) -> None:
        self.api = FakeClaimStatusAPI()
        self.board = HealthBoard(pool=NODE, clock=lambda: T0)
        self.board.set_devices(["gpu-0"])
        self.publisher = DeviceStatusPublisher(
            self.api, driver=DRIVER, node=NODE, inventory=_Inventory(), board=self.board,
            clock=lambda: T0,
        )  # fmt: skip

    async def settled(self) -> None:
        await asyncio.sleep(0)
        await asyncio.wait_for(self.publisher.idle.wait(), 5)

    def ours(self, uid: str = "") -> list[dict[str, Any]]:
        devices = self.api.claim("default", "claim-a")["status"].get("devices", [])
        return [d for d in devices if d["driver"] == DRIVER]


@pytest.fixture
async def rig():
    rig = _Rig()
    task = asyncio.create_task(rig.publisher.run())
    yield rig
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_prepared_claim_gets_its_entries_and_an_unprepared_one_loses_them(rig):
    uid = str(uuid.uuid4())
    rig.api.put(_claim(uid, "gpu-0", others=(NIC_ENTRY,)))
    rig.publisher.prepared(_record(uid, "gpu-0"), pods=None)
    await rig.settled()
    (entry,) = rig.ours()
    assert _conditions(entry)["Ready"] == ("True", "Prepared")
    assert _conditions(entry)["Healthy"] == ("Unknown", "HealthUnknown")
    rig.publisher.unprepared(uid)
    await rig.settled()
    assert rig.ours() == []
    assert rig.api.claim("default", "claim-a")["status"]["devices"] == [NIC_ENTRY]


async def test_a_health_verdict_updates_the_healthy_condition_and_nothing_else_is_written(rig):
    uid = str(uuid.uuid4())
    rig.api.put(_claim(uid, "gpu-0"))
    rig.publisher.prepared(_record(uid, "gpu-0"), pods=None)
    await rig.settled()
    rig.board.put("gpu-0", _health(health_pb2.HEALTH_STATE_UNHEALTHY, message="XID 79"))
    await asyncio.sleep(0.05)
    await rig.settled()
    (entry,) = rig.ours()
    assert _conditions(entry)["Healthy"] == ("False", "DeviceUnhealthy")
    writes = len(rig.api.puts)
    rig.board.put("gpu-0", _health(health_pb2.HEALTH_STATE_UNHEALTHY, message="XID 79"))
    rig.board.set_devices(["gpu-0", "gpu-9"])  # a change that leaves the claim's entry alone
    await asyncio.sleep(0.05)
    await rig.settled()
    assert len(rig.api.puts) == writes


async def test_a_conflict_reads_the_claim_again(rig):
    uid = str(uuid.uuid4())
    rig.api.put(_claim(uid, "gpu-0"))
    rig.api.conflicts = 2
    rig.publisher.prepared(_record(uid, "gpu-0"), pods=None)
    await rig.settled()
    assert len(rig.ours()) == 1


async def test_the_first_write_starts_from_the_claim_the_prepare_read(rig):
    uid = str(uuid.uuid4())
    rig.api.put(_claim(uid, "gpu-0", others=(NIC_ENTRY,)))
    read = rig.api.claim("default", "claim-a")
    rig.publisher.prepared(_record(uid, "gpu-0"), pods=None, resource=read)
    await rig.settled()
    assert rig.api.gets == 0
    assert len(rig.ours()) == 1
    assert read["status"]["devices"] == [NIC_ENTRY]  # the prepare's object is left as it was
    # Unprepared: no object was read for it, so the removal reads the claim.
    rig.publisher.unprepared(uid)
    await rig.settled()
    assert (rig.api.gets, rig.ours()) == (1, [])


async def test_a_claim_changed_since_the_prepare_read_it_is_read_again(rig):
    uid = str(uuid.uuid4())
    rig.api.put(_claim(uid, "gpu-0"))
    stale = copy.deepcopy(rig.api.claim("default", "claim-a"))
    rig.api.put({**stale, "metadata": {**stale["metadata"], "resourceVersion": "2"}})
    rig.publisher.prepared(_record(uid, "gpu-0"), pods=None, resource=stale)
    await rig.settled()
    assert rig.api.gets == 1
    assert len(rig.ours()) == 1


async def test_a_refused_write_is_left_alone_and_a_replaced_claim_untouched(rig):
    uid = str(uuid.uuid4())
    rig.api.put(_claim(uid, "gpu-0"))
    rig.api.refuse = "forbidden: resourceclaims/driver"
    rig.publisher.prepared(_record(uid, "gpu-0"), pods=None)
    await rig.settled()
    assert rig.api.puts == []
    rig.api.refuse = ""
    rig.api.put(_claim(str(uuid.uuid4()), "gpu-0"))  # same name, another UID
    rig.publisher.prepared(_record(uid, "gpu-0"), pods=None)
    await rig.settled()
    assert rig.api.puts == []


async def test_a_deallocated_or_deleted_claim_is_not_written(rig):
    uid = str(uuid.uuid4())
    claim = _claim(uid, "gpu-0")
    del claim["status"]["allocation"]
    rig.api.put(claim)
    rig.publisher.prepared(_record(uid, "gpu-0"), pods=None)
    await rig.settled()
    rig.publisher.prepared(_record(str(uuid.uuid4()), "gpu-0"), pods=None)
    await rig.settled()
    assert rig.api.puts == []


async def test_writes_wait_while_a_kubelet_call_is_in_flight_and_then_land_for_every_claim():
    calls = KubeletCalls(max_delay_s=30)
    api = FakeClaimStatusAPI()
    board = HealthBoard(pool=NODE, clock=lambda: T0)
    board.set_devices(["gpu-0"])
    publisher = DeviceStatusPublisher(
        api, driver=DRIVER, node=NODE, inventory=_Inventory(), board=board, clock=lambda: T0,
        quiet=calls.quiet,
    )  # fmt: skip
    task = asyncio.create_task(publisher.run())
    try:
        names = [f"claim-{i}" for i in range(20)]
        with calls.busy():
            for name in names:
                uid = str(uuid.uuid4())
                claim = _claim(uid, "gpu-0")
                claim["metadata"]["name"] = name
                api.put(claim)
                # Returns at once: the prepare that announces it never waits for the write.
                publisher.prepared(dataclasses.replace(_record(uid, "gpu-0"), name=name), pods=None)
            await asyncio.sleep(0.05)
            assert api.puts == []  # nothing written while the call is in flight
        await asyncio.wait_for(publisher.idle.wait(), 5)
        for name in names:
            devices = api.claim("default", name)["status"]["devices"]
            assert [(d["driver"], d["device"]) for d in devices] == [(DRIVER, "gpu-0")]
        assert len(api.puts) == len(names)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
