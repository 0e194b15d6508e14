"""A claim for a virtual machine end to end (docs/vfio.md): the sim allocation agent over a
fake sysfs tree (`--sysfs-root`, whose kernel it plays), prepared and unprepared through the
kubelet emulator, and killed (exit 137) at each step of the binding.

Prepared: the CDI spec hands only `/dev/vfio/vfio` and `/dev/vfio/<group>`, the metadata file
names the PCI address, the GPU and its audio function are on vfio-pci with `driver_override`
set, and the record names them. Unprepared: both back on their own drivers, nothing left. A
crash at any binding step, after the restart, is finished by the kubelet's retry (and then
undone by the unprepare) or undone by the unprepare of a claim that went away.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devcluster.kubelet import KubeletClaim, KubeletEmulator, KubeletError
from devcluster.processes import ChildProcess
from services.allocation.cdi import spec_files
from services.allocation.claim.checkpoint import ClaimState, PreparedVfio
from shared.bus import codec
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vfio import pci
from tests.fakes import sysfs_pci
from tests.integration.allocation.crash_harness import assert_crashed as _assert_crashed
from tests.integration.allocation.crash_harness import running as _running

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
BDF = "0000:3b:00.0"
AUDIO = "0000:3b:00.1"
VFIO = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "DeviceConfig", "passthrough": "vfio"}
ON_VFIO = [("vfio-pci", "vfio-pci"), ("vfio-pci", "vfio-pci")]
ON_OWN_DRIVERS = [("nvidia", None), ("snd_hda_intel", None)]


def _tree(plugin_node: Any) -> Path:
    root: Path = plugin_node.base / "sys"
    sysfs_pci.gpu(root, BDF, group=12)
    return root


def _state(root: Path) -> list[tuple[str | None, str | None]]:
    functions = [pci.read_function(root, bdf) for bdf in (BDF, AUDIO)]
    return [(f.driver, f.driver_override) for f in functions if f is not None]


async def _publish(plugin_node: Any) -> None:
    """What the sim discovery agent publishes for a sim GPU over the same tree."""
    device = inventory_pb2.Device(
        name="gpu-0",
        kind="gpu",
        uuid="GPU-9d11c4e2-e840-51ed-b15f-0be7ae073686",
        device_nodes=[inventory_pb2.DeviceNode(path="/dev/nvidia0", host_path="/dev/null")],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
    )
    device.attributes["type"].string = "gpu"
    device.attributes["resource.kubernetes.io/pciBusID"].string = BDF
    device.attributes["iommuGroup"].int = 12
    device.attributes["vfioViable"].bool = True
    inventory = inventory_pb2.Inventory(
        driver=DRIVER, node=NODE, pool=NODE, backend="sim", generation=1, devices=[device]
    )
    bus = plugin_node.bus
    key = bus.names.inventory_key(DRIVER, NODE)
    await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(inventory))


def _expected_ids(claim: KubeletClaim) -> list[list[str]]:
    return [[spec_files.device_id(DRIVER, spec_files.device_name(claim.uid, "gpu-0"))]]


async def _prepared(kubelet: KubeletEmulator, claim: KubeletClaim) -> list[list[str]]:
    answer = (await kubelet.prepare([claim])).claims[claim.uid]
    assert answer.error == ""
    return [list(device.cdi_device_ids) for device in answer.devices]


def _assert_released(plugin_node: Any, root: Path) -> None:
    assert _state(root) == ON_OWN_DRIVERS
    assert not plugin_node.config.vfio_ledger_path.exists()
    assert plugin_node.cdi_files() == []
    assert plugin_node.checkpoint_files() == []


async def test_a_vm_claim_gets_vfio_and_its_gpu_goes_back_to_its_driver(plugin_node):
    node = plugin_node
    root = _tree(node)
    await _publish(node)
    claim = node.allocate("vm-gpu", ["gpu-0"], parameters=VFIO)
    async with node.registered(sysfs_root=root) as (_, kubelet):
        assert await _prepared(kubelet, claim) == _expected_ids(claim)
        spec = node.spec(claim.uid)
        assert spec is not None
        assert spec["containerEdits"] == {
            "deviceNodes": [{"path": "/dev/vfio/vfio", "hostPath": "/dev/null"}]
        }
        (device,) = spec["devices"]
        edits = device["containerEdits"]
        assert edits["deviceNodes"] == [{"path": "/dev/vfio/12", "hostPath": "/dev/null"}]
        assert sorted(edits["env"]) == [
            f"DRA_SUITE_CLAIM_UID={claim.uid}",
            "DRA_SUITE_DEVICES=gpu-0",
        ]
        # The VM's launcher reads the PCI address from the metadata the spec mounts.
        (mount,) = edits["mounts"]
        host = node.config.metadata_dir / f"{claim.uid}_npu.json"
        assert mount["hostPath"] == str(host)
        first, _ = json.JSONDecoder().raw_decode(host.read_text())
        (entry,) = first["requests"][0]["devices"]
        assert entry["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": BDF}
        assert _state(root) == ON_VFIO
        ledger = json.loads(node.config.vfio_ledger_path.read_text())
        assert [(b["bdf"], b["originalDriver"]) for b in ledger["bindings"]] == [
            (BDF, "nvidia"),
            (AUDIO, "snd_hda_intel"),
        ]
        record = node.stored().get(claim.uid)
        assert record.state is ClaimState.PREPARE_COMPLETED
        assert record.vfio == (PreparedVfio(device="gpu-0", pci_bus_id=BDF, iommu_group=12),)
        assert await _prepared(kubelet, claim) == _expected_ids(claim)  # repeated: same
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        _assert_released(node, root)
        assert not (node.config.metadata_dir / claim.uid).exists()


async def test_without_a_sim_tree_a_vm_claim_fails_and_nothing_is_written(plugin_node):
    node = plugin_node
    await _publish(node)
    claim = node.allocate("vm-gpu", ["gpu-0"], parameters=VFIO)
    async with node.registered() as (_, kubelet):
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert "cannot pass devices through to a virtual machine" in answer.error
        assert node.cdi_files() == []
        assert node.checkpoint_files() == []


def _agent(plugin_node: Any, root: Path, crash_at: str = "") -> ChildProcess:
    process: ChildProcess = plugin_node.process(
        crash_at=crash_at, extra_args=["--sysfs-root", str(root)]
    )
    return process


BIND_STEPS = ["vfio-recorded", "vfio-override-set", "vfio-unbound", "vfio-bound"]


@pytest.mark.parametrize("step", BIND_STEPS)
async def test_a_crash_at_each_binding_step_is_finished_by_the_retry(plugin_node, step):
    root = _tree(plugin_node)
    await _publish(plugin_node)
    claim = plugin_node.allocate("vm-gpu", ["gpu-0"], parameters=VFIO)
    async with _running(plugin_node, _agent(plugin_node, root, step)) as (process, kubelet):
        with pytest.raises(KubeletError, match="NodePrepareResources"):
            await kubelet.prepare([claim])
        await _assert_crashed(plugin_node, process, step)
    # Died after the record and the ledger: both name the GPU before any write.
    assert plugin_node.stored().get(claim.uid).state is ClaimState.PREPARE_STARTED
    assert plugin_node.config.vfio_ledger_path.exists()
    async with _running(plugin_node, _agent(plugin_node, root)) as (_, kubelet):
        assert await _prepared(kubelet, claim) == _expected_ids(claim)
        assert _state(root) == ON_VFIO
        assert plugin_node.spec(claim.uid) is not None
        assert plugin_node.stored().get(claim.uid).state is ClaimState.PREPARE_COMPLETED
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        _assert_released(plugin_node, root)


async def test_a_crash_after_binding_is_undone_when_the_claim_went_away(plugin_node):
    root = _tree(plugin_node)
    await _publish(plugin_node)
    claim = plugin_node.allocate("vm-gpu", ["gpu-0"], parameters=VFIO)
    crash = _agent(plugin_node, root, "vfio-bound")
    async with _running(plugin_node, crash) as (process, kubelet):
        with pytest.raises(KubeletError, match="NodePrepareResources"):
            await kubelet.prepare([claim])
        await _assert_crashed(plugin_node, process, "vfio-bound")
    assert _state(root) == ON_VFIO
    plugin_node.api.delete_object("resourceclaims", claim.name, "default")
    async with _running(plugin_node, _agent(plugin_node, root)) as (_, kubelet):
        # The restart leaves a PrepareStarted claim to the kubelet: it unprepares it.
        assert _state(root) == ON_VFIO
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        _assert_released(plugin_node, root)


async def test_a_crash_during_the_release_is_finished_by_the_retry(plugin_node):
    root = _tree(plugin_node)
    await _publish(plugin_node)
    claim = plugin_node.allocate("vm-gpu", ["gpu-0"], parameters=VFIO)
    step = "unprepare-vfio-unbound"
    async with _running(plugin_node, _agent(plugin_node, root, step)) as (process, kubelet):
        assert await _prepared(kubelet, claim) == _expected_ids(claim)
        with pytest.raises(KubeletError, match="NodeUnprepareResources"):
            await kubelet.unprepare([claim])
        await _assert_crashed(plugin_node, process, step)
    assert _state(root)[0] == (None, None)  # unbound from vfio-pci, not yet back on nvidia
    async with _running(plugin_node, _agent(plugin_node, root)) as (_, kubelet):
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        _assert_released(plugin_node, root)
