"""One cluster, one pod spec (`sim.dra-suite.io/npu: 2` under limits), two kinds of node.

A DRA node (1.36, KEP-5004): the DeviceClass's `extendedResourceName` turns the pod's extended
resource into a claim, the scheduler allocates it from the node's slices, and the DRA front
prepares it. A device-plugin node: the kubelet's device manager asks the device-plugin front
for a preferred pair and allocates it. Both containers get two NPUs the same way. And the
move of a node between the two: the device-plugin front refuses to start while the DRA front
serves; once the DRA front is gone (the node drained and relabelled), it starts and registers.
As far as the emulators go: the API emulator, the scheduler's allocator and both kubelet
emulators are ours; the pod itself is not run.
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import scheduler
from services.allocation.deviceplugin.agent import DevicePluginAgent
from services.discovery import inventory, slices
from services.dractl.explain_manifest import read_manifest
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.supervisor import run_agent
from shared.vendors.sim.discovery import SimBackend
from tests.integration.allocation.deviceplugin_node import DRIVER, NPU, DevicePluginNode

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[3]
SIM_OVERLAY = REPO / "deploy" / "kustomize" / "overlays" / "sim"
POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "trainer"},
    "spec": {
        "containers": [
            {"name": "app", "image": "busybox:1.36", "resources": {"limits": {NPU: "2"}}}
        ]
    },
}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def classes_on_1_36() -> dict[str, dict[str, Any]]:
    """The sim overlay's DeviceClasses with its k8s-1.36 component's extended resource names."""
    classes = {d["metadata"]["name"]: d for d in _docs(SIM_OVERLAY / "deviceclasses.yaml")}
    for patch in _docs(SIM_OVERLAY / "k8s-1.36" / "extended-resources.yaml"):
        name = patch["metadata"]["name"]
        classes[name] = {**classes[name], "spec": {**classes[name]["spec"], **patch["spec"]}}
    return classes


async def node_slices(node: str) -> tuple[list[dict[str, Any]], Any]:
    scan = await SimBackend.from_profile("mixed").scan()
    identity = inventory.Identity(driver=DRIVER, node=node, pool=node, backend="sim")
    built = inventory.build(scan, identity=identity, scanned_unix_ms=0)
    pool = slices.desired(built)
    spec = {"driver": DRIVER, "nodeName": node, "pool": {"name": node}}
    found = [
        {"metadata": {"name": f"{node}-{i}"}, "spec": {**spec, **content}}
        for i, content in enumerate(pool.contents)
    ]
    return found, built


@pytest.fixture
async def dp_base() -> AsyncIterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield base
    gc.collect()
    shutil.rmtree(base, ignore_errors=True)


def healthy(count: int):
    return lambda devices: len(devices) == count and set(devices.values()) == {"Healthy"}


async def test_one_pod_spec_gets_two_npus_on_a_dra_node_and_on_a_device_plugin_node(
    plugin_node, nats_settings: NATSSettings, bus: Bus, dp_base: Path
):
    # --- the DRA node (node-a) -------------------------------------------------------------
    classes = classes_on_1_36()
    stored = plugin_node.api.create_object(classes["npu.sim.dra-suite.io"])
    assert stored["spec"]["extendedResourceName"] == NPU  # kept: DRAExtendedResource is on
    (claim,) = read_manifest([POD], namespace="default").pod_claims(
        templates={}, claims={}, classes=[stored]
    )
    node_a_slices, node_a_inventory = await node_slices("node-a")
    picked = [r.device for r in scheduler.allocate(claim, classes=classes, slices=node_a_slices)]
    assert picked == ["npu-0", "npu-1"]
    key = bus.names.inventory_key(DRIVER, "node-a")
    await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(node_a_inventory))
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.eventually(lambda: "npu-1" in agent.inventory.device_names())
        made = plugin_node.allocate(claim["metadata"]["name"], picked)
        answer = (await kubelet.prepare([made])).claims[made.uid]
        assert answer.error == ""
        spec = plugin_node.spec(made.uid)
    assert spec is not None
    dra_env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    assert dra_env["ASCEND_VISIBLE_DEVICES"] == "0,1"

    # --- the device-plugin node (node-dp), the same pod spec --------------------------------
    node = DevicePluginNode(dp_base, nats=nats_settings, bus=bus, node="node-dp")
    await node.kubelet.start()
    try:
        await node.publish_profile("mixed")
        ((resource, amount),) = POD["spec"]["containers"][0]["resources"]["limits"].items()
        async with node.agent():
            await node.kubelet.wait_for_devices(resource, healthy(8))
            container = await node.kubelet.admit(resource, int(amount))
            second = await node.kubelet.admit(resource, int(amount))
    finally:
        await node.kubelet.stop()
    assert node.kubelet.allocations[NPU] == [["npu-0", "npu-1"], ["npu-2", "npu-3"]]
    assert second.envs["ASCEND_VISIBLE_DEVICES"] == "2,3"
    assert container.envs["ASCEND_VISIBLE_DEVICES"] == dra_env["ASCEND_VISIBLE_DEVICES"]
    assert [d.container_path for d in container.devices] == ["/dev/davinci0", "/dev/davinci1"]


async def test_a_node_moves_from_the_dra_front_to_the_device_plugin_front(
    plugin_node, nats_settings: NATSSettings, bus: Bus
):
    node = DevicePluginNode(plugin_node.base, nats=nats_settings, bus=bus, node="node-a")
    config = dataclasses.replace(
        node.config,
        plugin_registry_dir=plugin_node.config.plugin_registry_dir,
        plugin_data_dir=plugin_node.config.data_dir,
    )
    await node.publish_profile("mixed")
    await node.kubelet.start()
    try:
        async with plugin_node.registered():
            # Still a DRA node: the device-plugin front must not start beside it.
            code = await run_agent(DevicePluginAgent(config), grace_s=5, handle_signals=False)
            assert code == 2
            assert node.kubelet.registrations == []
        # Drained and relabelled: the DRA front is gone, the device-plugin front takes over,
        # on the same inventory copy and data directory.
        async with node.agent(
            plugin_registry_dir=config.plugin_registry_dir, plugin_data_dir=config.plugin_data_dir
        ):
            await node.kubelet.wait_for_devices(NPU, healthy(8))
    finally:
        await node.kubelet.stop()
