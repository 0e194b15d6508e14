"""MIG on the nvml backend end to end, with the allocation agent as a real process.

The node is two H100-80GB GPUs in MIG mode behind a fake NVML whose GPU instances outlive the
agent (`nvml_mig_agent.py`, a state file). The inventory is what the nvml discovery backend
publishes for them (`--mig-profiles 1g.10gb,3g.40gb`); the claim names no device and no
partition profile: its CEL selector asks for a `1g.10gb` MIG device, and the product allocator
picks a published slot for it (an option made on demand). Preparing it makes the MIG device
through NVML; the CDI spec gives the container that device; a rescan publishes the slot as
the same option, naming no UUID that unprepare destroys; unprepare destroys the MIG device.
Killed with -9 right after the MIG device was made (`partition-created`), the agent's next
start and the kubelet's retry finish the claim with that device, never a second one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import scheduler
from devcluster.kubelet import KubeletClaim, KubeletEmulator, KubeletError
from devcluster.processes import ChildProcess
from services.allocation.claim.checkpoint import ClaimState
from services.discovery import inventory, slices
from shared.bus import codec
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors import nvidia
from shared.vendors.nvidia import discovery as nvml
from shared.vendors.parts.sysfs import Sysfs
from tests.fakes.nvml import FakeGpuInstance, FakeNVML
from tests.fakes.nvml_mig import cap_minor, read_state
from tests.integration.allocation import nvml_mig_agent

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"  # the plugin node's driver name; its backend here is nvml
NODE = "node-a"
REPO = Path(__file__).resolve().parents[3]
MIG_CLASS: dict[str, Any] = {
    "metadata": {"name": f"mig.{DRIVER}"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": f'device.driver == "{DRIVER}" && '
                    f'device.attributes["{DRIVER}"].type == "mig"'
                }
            }
        ]
    },
}
ONE_G = f'device.attributes["{DRIVER}"].profile == "1g.10gb"'


class MigNode:
    """The plugin node with its fake GPUs: what discovery publishes, what NVML holds."""

    def __init__(self, plugin_node: Any) -> None:
        self.plugin = plugin_node
        self.state = plugin_node.base / "nvml-state.json"
        self.caps = plugin_node.base / "capabilities"
        self.generation = 0

    def instances(self) -> dict[int, dict[int, FakeGpuInstance]]:
        """The GPU instances on the fake GPUs (GPU index -> GI id -> GI), as NVML has them."""
        return {i: gis for i, gis in read_state(self.state).items() if gis}

    def ledger(self) -> list[dict[str, Any]]:
        path = self.plugin.config.data_dir / nvidia.STATE_FILE
        entries: list[dict[str, Any]] = json.loads(path.read_text())["partitions"]
        return entries

    async def publish(self) -> tuple[inventory_pb2.Inventory, list[dict[str, Any]]]:
        """Scan the GPUs as the nvml discovery backend does and put the inventory in the KV."""
        fake = FakeNVML.node(
            nvml_mig_agent.MODEL, count=nvml_mig_agent.COUNT, nvlink="none", mig_enabled=True
        )
        fake.instances.update(read_state(self.state))
        options = nvml.NvmlOptions(mig_profiles=("1g.10gb", "3g.40gb"))
        scan = await nvml.NvmlBackend.open(fake, options=options, sysfs=Sysfs("/none")).scan()
        self.generation += 1
        identity = inventory.Identity(driver=DRIVER, node=NODE, pool=NODE, backend="nvml")
        built = inventory.build(scan, identity=identity, scanned_unix_ms=0)
        built.generation = self.generation
        bus = self.plugin.bus
        key = bus.names.inventory_key(DRIVER, NODE)
        await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(built))
        pool = slices.desired(built)
        spec = {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE}}
        return built, [
            {"metadata": {"name": f"{NODE}-{i}"}, "spec": {**spec, **content}}
            for i, content in enumerate(pool.contents)
        ]

    def allocate(self, name: str, published: list[dict[str, Any]]) -> tuple[KubeletClaim, str]:
        """A claim for one 1g.10gb MIG device by its attributes alone, allocated as the
        scheduler would on the published slices; the claim and the device it got."""
        request = {
            "name": "mig",
            "exactly": {
                "deviceClassName": MIG_CLASS["metadata"]["name"],
                "selectors": [{"cel": {"expression": ONE_G}}],
            },
        }
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [request]}},
        }
        classes = {MIG_CLASS["metadata"]["name"]: MIG_CLASS}
        [result] = scheduler.allocate(claim, classes=classes, slices=published)
        created = self.plugin.api.create_object(claim)
        created["status"] = {"allocation": {"devices": {"results": [result.as_json()]}}}
        created = self.plugin.api.update_object(created, status=True)
        uid = created["metadata"]["uid"]
        return KubeletClaim(namespace="default", name=name, uid=uid), result.device

    def process(self, *, crash_at: str = "") -> ChildProcess:
        """The agent (`--backend nvml`) as a process over the fake NVML."""
        process: ChildProcess = self.plugin.process(
            crash_at=crash_at, extra_args=("--backend", "nvml")
        )
        process.argv[process.argv.index("services.allocation")] = nvml_mig_agent.__name__
        process.env.update(
            {
                nvml_mig_agent.STATE_ENV: str(self.state),
                nvml_mig_agent.CAPABILITIES_ENV: str(self.caps),
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
                ),
            }
        )
        return process

    def agent_has_generation(self) -> bool:
        path = self.plugin.config.inventory_path
        if not path.exists():
            return False
        stored = codec.decode(inventory_pb2.Inventory, path.read_bytes(), subject=str(path))
        return stored.generation == self.generation


@contextlib.asynccontextmanager
async def _running(node: MigNode, process: ChildProcess) -> AsyncIterator[KubeletEmulator]:
    await process.start()
    kubelet = KubeletEmulator(node.plugin.config.plugin_registry_dir)
    try:
        await node.plugin.eventually(node.agent_has_generation, timeout_s=20)
        await kubelet.register(driver=DRIVER, timeout_s=20)
        yield kubelet
    finally:
        await kubelet.close()
        await process.stop()


def _device(built: inventory_pb2.Inventory, name: str) -> inventory_pb2.Device:
    [device] = [d for d in built.devices if d.name == name]
    return device


def _only_mig_device(node: MigNode) -> tuple[int, FakeGpuInstance, str]:
    """(GPU index, GI, MIG UUID) of the one MIG device on the node."""
    [(index, by_id)] = node.instances().items()
    [gi] = by_id.values()
    [uuid] = gi.uuids.values()
    return index, gi, uuid


def _assert_spec_gives(plugin_node: Any, uid: str, index: int, gi: FakeGpuInstance, uuid: str):
    spec = plugin_node.spec(uid)
    assert spec is not None
    [device] = spec["devices"]
    env = dict(item.split("=", 1) for item in device["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert env["DRA_SUITE_PARTITION_ID"] == uuid
    assert env["DRA_SUITE_PARTITION_PROFILE"] == "1g.10gb"
    [ci] = gi.cis
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == [
        f"/dev/nvidia{index}",
        f"/dev/nvidia-caps/nvidia-cap{cap_minor(index, gi.id)}",
        f"/dev/nvidia-caps/nvidia-cap{cap_minor(index, gi.id, ci)}",
    ]


@pytest.fixture
def mig_node(plugin_node) -> MigNode:
    return MigNode(plugin_node)


async def test_a_mig_slot_chosen_by_its_attributes_is_made_given_and_destroyed(
    mig_node, plugin_node
):
    built, published = await mig_node.publish()
    claim, slot = mig_node.allocate("mig", published)
    option = _device(built, slot)
    assert (option.attributes["createdOnDemand"].bool, option.uuid) == (True, "")
    assert mig_node.instances() == {}

    async with _running(mig_node, mig_node.process()) as kubelet:
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert answer.error == "", plugin_node.log()
        index, gi, uuid = _only_mig_device(mig_node)
        assert gi.placement.start == option.attributes["placementStart"].int
        assert (f"gpu-{index}", len(gi.cis)) == (option.parent, 1)
        _assert_spec_gives(plugin_node, claim.uid, index, gi, uuid)
        [entry] = mig_node.ledger()
        assert (entry["claimUID"], entry["id"]) == (claim.uid, uuid)

        # Discovery's next scan: the slot is still the option it was allocated as; the UUID
        # is the claim's (CDI spec), never the slice's, so unprepare leaves none stale there.
        rescanned, _ = await mig_node.publish()
        assert _device(rescanned, slot) == option

        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert mig_node.instances() == {}
        assert mig_node.ledger() == []
        assert plugin_node.cdi_files() == []
        assert plugin_node.checkpoint_files() == []
    again, _ = await mig_node.publish()
    assert _device(again, slot).attributes["createdOnDemand"].bool


async def test_a_crash_right_after_the_mig_device_was_made_neither_leaks_nor_duplicates_it(
    mig_node, plugin_node
):
    _, published = await mig_node.publish()
    claim, slot = mig_node.allocate("mig", published)
    crash = mig_node.process(crash_at="partition-created")
    async with _running(mig_node, crash) as kubelet:
        with pytest.raises(KubeletError, match="NodePrepareResources"):
            await kubelet.prepare([claim])
        assert await crash.stop() in (137, 255), plugin_node.log()
    index, gi, uuid = _only_mig_device(mig_node)  # made, on the "hardware"
    assert plugin_node.stored().get(claim.uid).state is ClaimState.PREPARE_STARTED
    assert plugin_node.spec(claim.uid) is None

    # While the agent was down, discovery rescanned: the slot is still the option.
    rescanned, _ = await mig_node.publish()
    assert _device(rescanned, slot).attributes["createdOnDemand"].bool
    assert uuid not in str(_device(rescanned, slot))

    async with _running(mig_node, mig_node.process()) as kubelet:
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert answer.error == "", plugin_node.log()
        assert _only_mig_device(mig_node) == (index, gi, uuid)  # found, not made again
        _assert_spec_gives(plugin_node, claim.uid, index, gi, uuid)
        record = plugin_node.stored().get(claim.uid)
        assert record.state is ClaimState.PREPARE_COMPLETED
        assert [p.partition_id for p in record.partitions] == [uuid]

        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert mig_node.instances() == {}
        assert mig_node.ledger() == []
        assert plugin_node.cdi_files() == []
