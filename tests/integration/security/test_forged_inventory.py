"""Issue 11's attack, end to end: a plain NATS client rewrites a device of the node's inventory
key; the allocation agent, called through real gRPC NodePrepareResources, refuses that claim
(no CDI spec, no checkpoint record), prepares its neighbour in the same call, counts the refused
edits and logs them with `security=true`. A claim allocated for another node fails likewise.

Issue 20 item 6 and issue 22 item 5 on the same rig: an inventory naming another backend than
the node's own (`--backend`) is never adopted, even as the first one; a forged device that
names every chip of the node in its nodes and visible-device variables fails its claim.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, MutableMapping
from pathlib import Path
from typing import Any

import nats
import pytest

from devcluster.apiserver import APIServerEmulator
from services.allocation.node_view.inventory_cache import BACKEND_MISMATCH
from shared import metrics
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from shared.pb.drasuite.v1 import inventory_pb2
from tests.integration.allocation.conftest import DRIVER, NODE, PluginNode

pytestmark = pytest.mark.integration

Forgery = Callable[[inventory_pb2.Device], None]


@pytest.fixture
async def plugin_node(
    nats_settings: NATSSettings, kube_settings: KubeSettings, kube: APIServerEmulator, bus: Bus
) -> AsyncIterator[PluginNode]:
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield PluginNode(base, nats=nats_settings, kube=kube_settings, api=kube, bus=bus)
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def _forge(nats_url: str, bus: Bus, forgery: Forgery) -> inventory_pb2.Inventory:
    """What an attacker with a bare NATS client does: read the key, change one device, put it
    back with the next generation (so it also passes the inventory sanity checks)."""
    client = await nats.connect(nats_url)
    try:
        store = await client.jetstream().key_value(bus.names.inventory_bucket)
        key = bus.names.inventory_key(DRIVER, NODE)
        inventory = inventory_pb2.Inventory.FromString((await store.get(key)).value or b"")
        forgery(inventory.devices[0])
        inventory.generation += 1
        await store.put(key, codec.encode(inventory))
    finally:
        await client.drain()
    return inventory


def _rejected_edits(kind: str) -> float:
    metrics.configure(service="test")
    pattern = rf'dra_prepare_rejected_edits_total\{{backend="sim",kind="{kind}"\}} ([0-9.]+)'
    found = re.search(pattern, metrics.render().decode())
    return float(found.group(1)) if found else 0.0


def _the_issue_attack(device: inventory_pb2.Device) -> None:
    device.device_nodes[0].host_path = "/dev/sda"
    device.device_nodes.add(path="/dev/mem", host_path="/dev/null")
    device.env["LD_PRELOAD"] = "/host/evil.so"


async def test_a_forged_device_reaches_no_container_and_its_neighbour_is_prepared(
    plugin_node: PluginNode, nats_settings: NATSSettings, bus_events: list[Any]
) -> None:
    before = {kind: _rejected_edits(kind) for kind in ("host_path", "device_node", "env_name")}
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.publish_inventory("npu-0", "npu-1")
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        forged = await _forge(nats_settings.url, plugin_node.bus, _the_issue_attack)
        await plugin_node.eventually(
            lambda: (
                agent.inventory.current is not None
                and agent.inventory.current.generation == forged.generation
            )
        )
        victim = plugin_node.allocate("victim", ["npu-0"])
        neighbour = plugin_node.allocate("neighbour", ["npu-1"])

        answer = await kubelet.prepare([victim, neighbour])

        error = answer.claims[victim.uid].error
        assert "device npu-0: host path '/dev/sda' as '/dev/davinci0'" in error
        assert "device npu-0: device node '/dev/mem'" in error
        assert "device npu-0: env name 'LD_PRELOAD'" in error
        assert plugin_node.spec(victim.uid) is None
        assert agent.checkpoints.get(victim.uid) is None
        assert answer.claims[neighbour.uid].error == ""
        spec = plugin_node.spec(neighbour.uid)
        assert spec is not None
        assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
            {"path": "/dev/davinci1", "hostPath": "/dev/null"}
        ]
    after = {kind: _rejected_edits(kind) for kind in before}
    assert {kind: after[kind] - before[kind] for kind in before} == {
        "host_path": 1.0,
        "device_node": 1.0,
        "env_name": 1.0,
    }
    security = [e for e in bus_events if e.get("event") == "cdi_edit_rejected"]
    assert {(e["device"], e["kind"], e["security"]) for e in security} == {
        ("npu-0", "host_path", True),
        ("npu-0", "device_node", True),
        ("npu-0", "env_name", True),
    }
    assert all(e["log_level"] == "warning" and e["backend"] == "sim" for e in security)


def _env(name: str, value: str) -> Forgery:
    def forge(device: inventory_pb2.Device) -> None:
        device.env[name] = value

    return forge


def _node(path: str, host: str) -> Forgery:
    def forge(device: inventory_pb2.Device) -> None:
        del device.device_nodes[:]
        device.device_nodes.add(path=path, host_path=host)

    return forge


@pytest.mark.parametrize(
    ("forgery", "named"),
    [
        (_node("/dev/davinci0", "/dev/nvme0n1"), "host path '/dev/nvme0n1' as '/dev/davinci0'"),
        (_node("/dev/davinci0", ""), "host path '' as '/dev/davinci0'"),
        (_node("/host", "/"), "device node '/host'"),
        (_node("/dev/kmsg", "/dev/null"), "device node '/dev/kmsg'"),
        (_env("LD_LIBRARY_PATH", "/host/lib"), "env name 'LD_LIBRARY_PATH'"),
        (_env("PATH", "/host/bin"), "env name 'PATH'"),
        (_env("NVIDIA_VISIBLE_DEVICES", "all"), "env value 'NVIDIA_VISIBLE_DEVICES=all'"),
        (
            _env("ASCEND_VISIBLE_DEVICES", "0,1"),
            "env value 'ASCEND_VISIBLE_DEVICES=0,1' (not this device's)",
        ),
        (_node("/dev/davinci1", "/dev/null"), "device node '/dev/davinci1' (not this device's)"),
        (
            _node("/dev/nvidia-caps/nvidia-cap1", "/dev/null"),
            "device node '/dev/nvidia-caps/nvidia-cap1'",
        ),
        (
            _env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1M LD_PRELOAD=/e.so"),
            "env value 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1M LD_PRELOAD=/e.so'",
        ),
    ],
    ids=[
        "host-disk",
        "real-host-node",
        "mount-of-host-root",
        "unlisted-node",
        "ld-library-path",
        "path",
        "all-gpus",
        "every-npu-of-the-node",
        "the-neighbours-node",
        "mig-config-capability",
        "unchecked-mps-value",
    ],
)
async def test_variants_of_the_forgery_fail_only_their_claim(
    plugin_node: PluginNode, nats_settings: NATSSettings, forgery: Forgery, named: str
) -> None:
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.publish_inventory("npu-0", "npu-1")
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        forged = await _forge(nats_settings.url, plugin_node.bus, forgery)
        await plugin_node.eventually(
            lambda: (
                agent.inventory.current is not None
                and agent.inventory.current.generation == forged.generation
            )
        )
        victim = plugin_node.allocate("victim", ["npu-0"])
        neighbour = plugin_node.allocate("neighbour", ["npu-1"])
        answer = await kubelet.prepare([victim, neighbour])
        assert f"device npu-0: {named}" in answer.claims[victim.uid].error
        assert plugin_node.spec(victim.uid) is None
        assert answer.claims[neighbour.uid].error == ""
        assert plugin_node.spec(neighbour.uid) is not None


async def test_a_claim_allocated_for_another_node_is_not_prepared_here(
    plugin_node: PluginNode,
) -> None:
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.publish_inventory("npu-0", "npu-1")
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        elsewhere = plugin_node.allocate("elsewhere", ["npu-0"])
        here = plugin_node.allocate("here", ["npu-1"])
        for claim, node in ((elsewhere, "node-b"), (here, NODE)):
            _select_node(plugin_node, claim.name, node)

        answer = await kubelet.prepare([elsewhere, here])

        assert "nodeSelector does not select node node-a" in answer.claims[elsewhere.uid].error
        assert "metadata.name In ['node-b']" in answer.claims[elsewhere.uid].error
        assert plugin_node.spec(elsewhere.uid) is None
        assert answer.claims[here.uid].error == ""


def _select_node(plugin_node: PluginNode, name: str, node: str) -> None:
    """Write the nodeSelector that the scheduler's allocator writes for a node-local device."""
    claim: MutableMapping[str, Any] | None = plugin_node.api.get_object(
        "resourceclaims", name, "default"
    )
    assert claim is not None
    claim["status"]["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    plugin_node.api.update_object(claim, status=True)


async def test_no_partition_is_made_of_a_forged_device_and_a_forged_partition_never_lands(
    plugin_node: PluginNode, nats_settings: NATSSettings
) -> None:
    vnpu = {
        "apiVersion": f"{DRIVER}/v1alpha1",
        "kind": "DeviceConfig",
        "partition": {"profile": "vir05_1c_8g"},
    }
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.publish_inventory("npu-0", "npu-1")
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        forged = await _forge(
            nats_settings.url, plugin_node.bus, _node("/dev/davinci0", "/dev/sda")
        )
        await plugin_node.eventually(
            lambda: (
                agent.inventory.current is not None
                and agent.inventory.current.generation == forged.generation
            )
        )
        victim = plugin_node.allocate("victim", ["npu-0"], parameters=vnpu)
        neighbour = plugin_node.allocate("neighbour", ["npu-1"], parameters=vnpu)
        answer = await kubelet.prepare([victim, neighbour])
        assert "device npu-0: host path '/dev/sda'" in answer.claims[victim.uid].error
        assert plugin_node.spec(victim.uid) is None
        assert answer.claims[neighbour.uid].error == ""
        assert [p["claimUID"] for p in plugin_node.partitions()] == [neighbour.uid]


async def test_a_forged_backend_that_would_widen_the_allowlist_is_refused(
    plugin_node: PluginNode, nats_settings: NATSSettings, bus_events: list[Any]
) -> None:
    async with plugin_node.registered() as (agent, kubelet):
        good = await plugin_node.publish_inventory("npu-0", "npu-1")
        await plugin_node.eventually(lambda: agent.inventory.current == good)

        client = await nats.connect(nats_settings.url)
        try:
            store = await client.jetstream().key_value(plugin_node.bus.names.inventory_bucket)
            forged = inventory_pb2.Inventory()
            forged.CopyFrom(good)
            # The ascend rules take a host path equal to the container path: a real node.
            forged.devices[0].device_nodes[0].host_path = ""
            forged.backend = "ascend"
            forged.generation += 1
            await store.put(plugin_node.bus.names.inventory_key(DRIVER, NODE), codec.encode(forged))
        finally:
            await client.drain()
        await plugin_node.eventually(
            lambda: any(e.get("reason") == BACKEND_MISMATCH for e in bus_events)
        )
        assert agent.inventory.current == good
        claim = plugin_node.allocate("victim", ["npu-0"])
        assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
        spec = plugin_node.spec(claim.uid)
        assert spec is not None
        assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
            {"path": "/dev/davinci0", "hostPath": "/dev/null"}
        ]


def _forged_nvml_inventory() -> inventory_pb2.Inventory:
    """What an attacker puts on a sim node's key: an nvml inventory whose one GPU brings every
    real /dev/nvidiaN and asks the runtime for all of them."""
    gpu = inventory_pb2.Device(name="gpu-0", kind="gpu", uuid="GPU-0")
    for minor in range(8):
        gpu.device_nodes.add(path=f"/dev/nvidia{minor}")
    gpu.env["NVIDIA_VISIBLE_DEVICES"] = ",".join(f"GPU-{i}" for i in range(8))
    return inventory_pb2.Inventory(
        driver=DRIVER, node=NODE, pool=NODE, backend="nvml", generation=1, devices=[gpu]
    )


def _refused_inventories() -> float:
    metrics.configure(service="test")
    line = f'dra_inventory_rejected_total{{reason="{BACKEND_MISMATCH}"}} '
    return sum(
        float(text.removeprefix(line))
        for text in metrics.render().decode().splitlines()
        if text.startswith(line)
    )


async def test_a_first_inventory_claiming_nvml_on_a_sim_node_is_refused(
    plugin_node: PluginNode, nats_settings: NATSSettings, bus_events: list[Any]
) -> None:
    before = _refused_inventories()
    async with plugin_node.registered(inventory_wait_s=0.5) as (agent, kubelet):
        client = await nats.connect(nats_settings.url)
        try:
            store = await client.jetstream().key_value(plugin_node.bus.names.inventory_bucket)
            key = plugin_node.bus.names.inventory_key(DRIVER, NODE)
            await store.put(key, codec.encode(_forged_nvml_inventory()))
        finally:
            await client.drain()
        await plugin_node.eventually(
            lambda: any(e.get("event") == "inventory_refused" for e in bus_events)
        )
        assert agent.inventory.current is None
        assert not plugin_node.config.inventory_path.exists()
        victim = plugin_node.allocate("victim", ["gpu-0"])
        answer = await kubelet.prepare([victim])
        assert "device inventory is not known yet" in answer.claims[victim.uid].error
        assert plugin_node.spec(victim.uid) is None
        assert plugin_node.cdi_files() == []

        # Discovery's own inventory still gets through, and the forgery stays out after it.
        good = await plugin_node.publish_inventory("npu-0")
        await plugin_node.eventually(lambda: agent.inventory.current == good)
        later = _forged_nvml_inventory()
        later.generation = good.generation + 1
        await plugin_node.bus.kv_put(
            plugin_node.bus.names.inventory_bucket,
            plugin_node.bus.names.inventory_key(DRIVER, NODE),
            codec.encode(later),
        )
        await plugin_node.eventually(
            lambda: sum(e.get("event") == "inventory_refused" for e in bus_events) == 2
        )
        assert agent.inventory.current == good
    refused = [e for e in bus_events if e.get("event") == "inventory_refused"]
    assert {(e["security"], e["reason"], e["backend"], e["own_backend"]) for e in refused} == {
        (True, BACKEND_MISMATCH, "nvml", "sim")
    }
    assert _refused_inventories() - before == 2.0
