"""Every shipped MIG example claim, as written, prepares on an nvml node.

The node is a fake NVML A100-80GB or H100-80GB node in MIG mode. Its slices are what the nvml
discovery backend publishes with the nvidia overlay's `MIG_PROFILES`; the claim is allocated on
them by the product allocator (`services.allocator`, through the devcluster scheduler) with
the overlay's DeviceClasses; the allocation agent's preparer, with the MIG partition manager
over the same fake GPUs, prepares it: the MIG device is made, the CDI spec names it, a rescan
publishes the slot unchanged (its UUID is the claim's only), and unprepare destroys it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import scheduler
from services.allocation.cdi import spec_files
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore, ClaimState
from services.allocation.claim.claims import ClaimReader, ClaimRef
from services.allocation.dra.preparer import ClaimPreparer
from services.allocation.partitions.by_backend import CompositePartitionManager
from services.discovery import inventory, slices
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import discovery as nvml
from shared.vendors.nvidia.partitions import MigPartitionManager
from shared.vendors.parts.sysfs import Sysfs
from tests.fakes.allocation_sources import FakeInventory, OneClaimReader
from tests.fakes.nvml import FakeNVML
from tests.fakes.nvml_mig import FakeMigNVML, cap_minor
from tests.unit.deploy.manifests import (
    EXAMPLE_FILES,
    KUSTOMIZE,
    _claim_spec,
    _overlay_classes,
    _safe_docs,
)

GPU = "gpu.dra-suite.io"
NODE = "node-a"
MODELS = ("A100-80GB", "H100-80GB")


def _mig_profiles() -> tuple[str, ...]:
    """`MIG_PROFILES` as the nvidia overlay's k8s-1.36 component sets it for discovery."""
    patch = KUSTOMIZE / "overlays" / "nvidia" / "k8s-1.36" / "discovery-patch.yaml"
    [container] = yaml.safe_load(patch.read_text())["spec"]["template"]["spec"]["containers"]
    [value] = [e["value"] for e in container["env"] if e["name"] == "MIG_PROFILES"]
    return tuple(value.split(","))


def _class_names(spec: dict[str, Any]) -> list[str]:
    names = []
    for request in spec.get("devices", {}).get("requests", []):
        if "exactly" in request:
            names.append(request["exactly"].get("deviceClassName", ""))
        names += [sub.get("deviceClassName", "") for sub in request.get("firstAvailable", [])]
    return names


def _mig_examples() -> list[tuple[str, dict[str, Any]]]:
    """(file name, claim object) of every example claim that asks for a MIG device class."""
    classes = _overlay_classes("nvidia")
    found = []
    for path in EXAMPLE_FILES:
        if path.name == "kustomization.yaml":
            continue
        for doc in _safe_docs(path):
            spec = _claim_spec(doc)
            if spec is None:
                continue
            if any(name in classes and "mig" in name for name in _class_names(spec)):
                found.append((path.name, {"metadata": dict(doc["metadata"]), "spec": spec}))
    return found


EXAMPLES = _mig_examples()


def test_every_example_file_about_mig_has_a_claim_prepared_here():
    mentioned = {
        p.name
        for p in EXAMPLE_FILES
        if p.name != "kustomization.yaml" and "mig" in p.read_text().lower()
    }
    assert mentioned
    assert mentioned == {name for name, _ in EXAMPLES}


async def _published(fake: FakeNVML) -> tuple[inventory_pb2.Inventory, list[dict[str, Any]]]:
    """The node's inventory and ResourceSlices, as the nvml discovery backend makes them."""
    options = nvml.NvmlOptions(mig_profiles=_mig_profiles())
    scan = await nvml.NvmlBackend(fake, options=options, sysfs=Sysfs("/nonexistent")).scan()
    identity = inventory.Identity(driver=GPU, node=NODE, pool=NODE, backend="nvml")
    built = inventory.build(scan, identity=identity, scanned_unix_ms=0)
    pool = slices.desired(built)
    assert not pool.rejected
    spec = {"driver": GPU, "nodeName": NODE, "pool": {"name": NODE}}
    return built, [
        {"metadata": {"name": f"{NODE}-{GPU}-{i}"}, "spec": {**spec, **content}}
        for i, content in enumerate(pool.contents)
    ]


def _device(built: inventory_pb2.Inventory, name: str) -> inventory_pb2.Device:
    [device] = [d for d in built.devices if d.name == name]
    return device


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("example", "claim"), EXAMPLES, ids=[c["metadata"]["name"] for _, c in EXAMPLES]
)
async def test_the_example_claim_prepares_the_mig_device_it_was_allocated(
    example, claim, model, tmp_path: Path
):
    fake = FakeNVML.node(model, count=2, nvlink="none", mig_enabled=True)
    caps = tmp_path / "capabilities"
    mig_nvml = FakeMigNVML(nvml=fake, capabilities_root=caps)
    built, slices_ = await _published(fake)

    results = scheduler.allocate(claim, classes=_overlay_classes("nvidia"), slices=slices_)
    allocated = [_device(built, r.device) for r in results]
    assert allocated
    assert all(d.kind == "mig" and d.attributes["createdOnDemand"].bool for d in allocated)

    uid = str(uuid.uuid4())
    ref = ClaimRef(namespace="default", name=claim["metadata"]["name"], uid=uid)
    stored = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": uid},
        "spec": claim["spec"],
        "status": {"allocation": {"devices": {"results": [r.as_json() for r in results]}}},
    }
    checkpoints = CheckpointStore(tmp_path / "checkpoint")
    checkpoints.load()
    (tmp_path / "cdi").mkdir()
    manager = MigPartitionManager(
        tmp_path / "mig-partitions.json", open_library=lambda: mig_nvml, capabilities_root=caps
    )
    preparer = ClaimPreparer(
        claims=ClaimReader(OneClaimReader(stored), driver=GPU, pool=NODE),
        inventory=FakeInventory(built),
        checkpoints=checkpoints,
        cdi_writer=CDIWriter(tmp_path / "cdi", driver=GPU),
        driver=GPU,
        backend="nvml",
        partitions=CompositePartitionManager([manager], backend=lambda: "nvml"),
    )

    record = await preparer.prepare(ref)
    assert record.state is ClaimState.PREPARE_COMPLETED
    made = [
        (index, gi, mig)
        for index, instances in fake.instances.items()
        for gi in instances.values()
        for mig in gi.uuids.values()
    ]
    assert len(made) == len(allocated)
    assert sorted(p.partition_id for p in record.partitions) == sorted(m for _, _, m in made)
    spec = json.loads((tmp_path / "cdi" / spec_files.spec_file_name(GPU, uid)).read_text())
    assert spec_files.validate(spec) == []
    given = {
        device["name"]: (
            dict(item.split("=", 1) for item in device["containerEdits"]["env"]),
            [n["path"] for n in device["containerEdits"]["deviceNodes"]],
        )
        for device in spec["devices"]
    }
    assert len(given) == len(made)
    for index, gi, mig in made:
        # One CDI device per MIG device made: its parent's node, its GI's and CI's caps.
        [ci] = gi.cis
        caps_nodes = [
            f"/dev/nvidia-caps/nvidia-cap{m}"
            for m in (cap_minor(index, gi.id), cap_minor(index, gi.id, ci))
        ]
        [(env, nodes)] = [(e, n) for e, n in given.values() if caps_nodes[0] in n]
        assert mig in env["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert nodes == [f"/dev/nvidia{index}", *caps_nodes]

    # The next scan publishes each allocated slot as the MIG device made for the claim.
    rescanned, _ = await _published(fake)
    for device, partition in zip(allocated, record.partitions, strict=True):
        now = _device(rescanned, device.name)
        assert (now.uuid, "createdOnDemand" in now.attributes) == ("", True)
        assert partition.partition_id not in str(now)

    await preparer.unprepare(ref)
    assert all(not instances for instances in fake.instances.values())
    assert checkpoints.get(uid) is None
    again, _ = await _published(fake)
    assert all(_device(again, d.name).attributes["createdOnDemand"].bool for d in allocated)
