"""Sim GPUs with MIG profiles and with shared memory: backend output and publishing rules."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.discovery import apirules, inventory, slices
from shared.pb.drasuite.v1 import inventory_pb2
from shared.sim import profile
from shared.sim.profile import SimDevice
from shared.vendors.nvidia import mig_devices as mig
from shared.vendors.sim import discovery as sim
from shared.vendors.sim import partitions as sim_partitions

DRIVER = "sim.dra-suite.io"


def _gpu(**extra) -> SimDevice:
    return SimDevice(
        name="gpu-0",
        kind="gpu",
        uuid="GPU-0",
        attributes={"index": 0, "numaNode": 0},
        capacity={"memory": "80Gi"},
        **extra,
    )


def _inventory(*devices: SimDevice) -> inventory_pb2.Inventory:
    backend = sim.SimBackend(list(devices))
    scan = asyncio.run(backend.scan())
    identity = inventory.Identity(driver=DRIVER, node="n1", pool="n1", backend="sim")
    return inventory.build(scan, identity=identity, scanned_unix_ms=0)


def _published(inv: inventory_pb2.Inventory, minor: int) -> dict[str, dict[str, Any]]:
    pool = slices.desired(inv, rules=apirules.for_minor(minor))
    assert pool.rejected == ()
    return {d["name"]: d for c in pool.contents for d in c.get("devices", [])}


def test_the_sim_h100_table_matches_the_profile_names_it_validates():
    assert tuple(p.name for p in sim.H100_MIG) == profile.H100_MIG_PROFILES


def test_a_sim_gpu_with_mig_profiles_publishes_its_placements_over_one_counter_set():
    devices, counters = sim.to_devices(_gpu(mig_profiles=("1g.10gb", "3g.40gb")))
    assert counters is not None
    assert counters.name == "gpu-0-counter-set"
    assert [f"memory-slice-{i}" for i in range(8)] == sorted(
        k for k in counters.counters if k.startswith("memory-slice-")
    )
    assert counters.counters["multiprocessors"] == "132"
    whole, *partitions = devices
    assert dict(whole.consumes_counters[0].counters) == dict(counters.counters)
    assert [d.name for d in partitions] == [
        *(f"gpu-0-mig-1g10gb-19-{i}" for i in range(7)),
        "gpu-0-mig-3g40gb-9-0",
        "gpu-0-mig-3g40gb-9-4",
    ]
    last = partitions[-1]
    assert (last.parent, last.attributes["profile"].string) == ("gpu-0", "3g.40gb")
    assert "index" not in last.attributes
    used = last.consumes_counters[0].counters
    assert sorted(k for k in used if k.startswith("memory-slice-")) == [
        f"memory-slice-{i}" for i in range(4, 8)
    ]


def test_a_sim_gpu_without_mig_profiles_is_one_device_without_counters():
    devices, counters = sim.to_devices(_gpu())
    assert counters is None
    assert [(d.name, list(d.consumes_counters)) for d in devices] == [("gpu-0", [])]


async def test_a_scan_of_the_gpu_mig_profile_has_a_counter_set_per_gpu():
    backend = sim.SimBackend.from_profile("gpu-mig")
    scan = await backend.scan()
    assert [c.name for c in scan.shared_counters] == [f"gpu-{i}-counter-set" for i in range(4)]
    assert len(scan.devices) == 4 * (1 + 7 + 3 + 2 + 1)


def test_shared_capacity_is_listed_on_the_inventory_device():
    device = sim.to_device(_gpu(shared={"memory": "1Gi"}))
    assert dict(device.shared_capacity) == {"memory": "1Gi"}
    assert not sim.to_device(_gpu()).shared_capacity


@pytest.mark.parametrize(
    ("minor", "shared"), [(34, False), (35, False), (36, True)], ids=["1.34", "1.35", "1.36"]
)
def test_shared_memory_is_consumable_only_from_1_36(minor, shared):
    published = _published(_inventory(_gpu(shared={"memory": "1Gi"})), minor)
    gpu = published["gpu-0"]
    if shared:
        assert gpu["allowMultipleAllocations"] is True
        assert gpu["capacity"]["memory"] == {
            "value": "80Gi",
            "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
        }
    else:  # the plain exclusive device, exactly as without `shared`
        assert gpu == _published(_inventory(_gpu()), minor)["gpu-0"]


def test_shared_memory_is_exclusive_when_the_server_has_consumable_capacity_off():
    rules = apirules.for_minor(36).without(["DRAConsumableCapacity"])
    pool = slices.desired(_inventory(_gpu(shared={"memory": "1Gi"})), rules=rules)
    (gpu,) = pool.contents[0]["devices"]
    assert "allowMultipleAllocations" not in gpu
    assert "requestPolicy" not in gpu["capacity"]["memory"]


def test_only_1_36_rules_offer_consumable_capacity():
    assert [apirules.for_minor(m).shared_capacity for m in (34, 35, 36)] == [False, False, True]


# --- options made on demand, and what the allocation agent makes of them -------------------


def test_sim_placements_are_flagged_as_made_on_demand_and_the_whole_gpu_is_not():
    whole, *partitions = sim.to_devices(_gpu(mig_profiles=("2g.20gb",)))[0]
    assert mig.ON_DEMAND not in whole.attributes
    assert all(p.attributes[mig.ON_DEMAND].bool for p in partitions)
    published = _published(_inventory(_gpu(mig_profiles=("2g.20gb",))), 36)
    assert published["gpu-0-mig-2g20gb-14-0"]["attributes"]["createdOnDemand"] == {"bool": True}


async def test_every_published_sim_option_is_a_partition_the_allocation_agent_can_make(tmp_path):
    # The allocation agent makes a partition of the parent GPU by profile name
    # (SimPartitionManager); each option must name a parent and a profile it knows, with the
    # same compute and memory slices as its counters consume.
    scan = await sim.SimBackend.from_profile("gpu-mig").scan()
    devices = {d.name: d for d in scan.devices}
    options = [d for d in scan.devices if mig.ON_DEMAND in d.attributes]
    assert len(options) == 4 * (7 + 3 + 2 + 1)
    manager = sim_partitions.SimPartitionManager(tmp_path / "sim-partitions.json")
    for option in options:
        parent = devices[option.parent]
        name = option.attributes["profile"].string
        manager.check(claim_uid="c", device=parent, profile=name)
        used = option.consumes_counters[0].counters
        memory_slices = sum(1 for k in used if k.startswith("memory-slice-"))
        assert sim_partitions.GPU_PROFILES[name] == (int(used["compute-slices"]), memory_slices)
    # A GPU's counters admit seven 1g.10gb options at once: the manager has room for them all.
    ones = [
        o for o in options if o.parent == "gpu-0" and o.attributes["profile"].string == "1g.10gb"
    ]
    for i, option in enumerate(ones):
        await manager.create(
            claim_uid=f"claim-{i}", device=devices[option.parent], profile="1g.10gb"
        )
    assert len(await manager.partitions()) == 7
