"""The KubeVirt example (examples/kubevirt, docs/vfio.md), as written, allocates and prepares a
GPU for a virtual machine on a sim node over a fake sysfs tree.

Discovery (sim backend over the tree) publishes `vfioViable` for the GPU alone in its IOMMU
group and not for the one sharing its group with a bridge; the example's DeviceClass selects
only the first; the claim, allocated by the product allocator with the class's config
(`passthrough: vfio`, FromClass, as the scheduler copies it), is prepared by the allocation
agent's preparer: vfio-pci bound, only the VFIO nodes in the CDI spec. The
VirtualMachineInstance takes the template's request as its GPU.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from devcluster import scheduler
from services.allocation.cdi import spec_files
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim import opaque
from services.allocation.claim.checkpoint import CheckpointStore, ClaimState
from services.allocation.claim.claims import ClaimReader, ClaimRef
from services.allocation.dra.preparer import ClaimPreparer
from services.allocation.metadata.files import MetadataFiles
from services.allocation.vfio.binder import VfioBinder
from services.allocation.vfio.ledger import VfioLedger
from services.discovery import inventory, slices
from shared.pb.drasuite.v1 import inventory_pb2
from shared.sim.profile import SimDevice, SimDeviceNode
from shared.vendors.parts.sysfs import Sysfs
from shared.vendors.sim.discovery import SimBackend
from shared.vfio import pci
from tests.fakes import sysfs_pci
from tests.fakes.allocation_sources import FakeInventory, OneClaimReader
from tests.unit.deploy.manifests import KUSTOMIZE, _docs

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
EXAMPLE = KUSTOMIZE / "examples" / "kubevirt" / "vm-gpu-passthrough.yaml"


def _of(kind: str) -> dict[str, Any]:
    (found,) = [d for d in _docs(EXAMPLE) if d["kind"] == kind]
    return found


def _gpu(index: int, bdf: str) -> SimDevice:
    return SimDevice(
        name=f"gpu-{index}",
        kind="gpu",
        uuid=f"GPU-0000000{index}-e840-51ed-b15f-0be7ae073686",
        attributes={"type": "gpu", "resource.kubernetes.io/pciBusID": bdf},
        device_nodes=(SimDeviceNode(path=f"/dev/nvidia{index}", host_path="/dev/null"),),
        env={"NVIDIA_VISIBLE_DEVICES": str(index)},
    )


async def _published(root: Path) -> tuple[inventory_pb2.Inventory, list[dict[str, Any]]]:
    sysfs_pci.gpu(root, "0000:3b:00.0", group=12)
    sysfs_pci.gpu(root, "0000:86:00.0", group=50, audio=False, pcie_root="pci0000:85")
    sysfs_pci.add_function(root, "0000:86:00.1", pci_class=sysfs_pci.BRIDGE_CLASS, iommu_group=50)
    backend = SimBackend([_gpu(1, "0000:86:00.0"), _gpu(0, "0000:3b:00.0")], sysfs=Sysfs(root))
    identity = inventory.Identity(driver=DRIVER, node=NODE, pool=NODE, backend="sim")
    built = inventory.build(await backend.scan(), identity=identity, scanned_unix_ms=0)
    pool = slices.desired(built)
    assert not pool.rejected
    spec = {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE}}
    return built, [
        {"metadata": {"name": f"{NODE}-{DRIVER}-{i}"}, "spec": {**spec, **content}}
        for i, content in enumerate(pool.contents)
    ]


async def test_the_example_passes_a_viable_gpu_through_to_the_vm(tmp_path: Path):
    root = tmp_path / "sys"
    built, slices_ = await _published(root)
    device_class = _of("DeviceClass")
    template = _of("ResourceClaimTemplate")
    results = scheduler.allocate(
        {"spec": template["spec"]["spec"]},
        classes={device_class["metadata"]["name"]: device_class},
        slices=slices_,
    )
    # gpu-1 shares its group with a bridge: not viable, never selected.
    assert [(r.request, r.device) for r in results] == [("gpu", "gpu-0")]
    (config,) = device_class["spec"]["config"]
    assert opaque.decode(config["opaque"]["parameters"], driver=DRIVER).passthrough == "vfio"

    uid = str(uuid.uuid4())
    ref = ClaimRef(namespace="default", name="vm-with-gpu-gpu-x7k2p", uid=uid)
    stored = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": uid},
        "spec": template["spec"]["spec"],
        "status": {
            "allocation": {
                "devices": {
                    "results": [r.as_json() for r in results],
                    "config": [{"source": "FromClass", "requests": [], **config}],
                }
            }
        },
    }
    checkpoints = CheckpointStore(tmp_path / "checkpoint")
    checkpoints.load()
    (tmp_path / "cdi").mkdir()
    preparer = ClaimPreparer(
        claims=ClaimReader(OneClaimReader(stored), driver=DRIVER, pool=NODE),
        inventory=FakeInventory(built),
        checkpoints=checkpoints,
        cdi_writer=CDIWriter(tmp_path / "cdi", driver=DRIVER),
        driver=DRIVER,
        backend="sim",
        metadata_files=MetadataFiles(tmp_path / "dra-device-metadata"),
        vfio=VfioBinder(
            sysfs_pci.SimPciKernel(root), VfioLedger(tmp_path / "vfio.json"), vendors=None
        ),
    )
    record = await preparer.prepare(ref)
    assert record.state is ClaimState.PREPARE_COMPLETED
    spec = json.loads((tmp_path / "cdi" / spec_files.spec_file_name(DRIVER, uid)).read_text())
    nodes = [
        n["path"]
        for edits in (spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"]))
        for n in edits.get("deviceNodes", [])
    ]
    assert nodes == ["/dev/vfio/vfio", "/dev/vfio/12"]
    assert [pci.read_function(root, b).driver for b in ("0000:3b:00.0", "0000:3b:00.1")] == [  # type: ignore[union-attr]
        "vfio-pci",
        "vfio-pci",
    ]
    await preparer.unprepare(ref)
    assert pci.read_function(root, "0000:3b:00.0").driver == "nvidia"  # type: ignore[union-attr]


def test_the_vm_takes_the_template_s_request_as_its_gpu():
    vmi = _of("VirtualMachineInstance")
    template = _of("ResourceClaimTemplate")
    assert vmi["apiVersion"] == "kubevirt.io/v1"
    claims = {c["name"]: c for c in vmi["spec"]["resourceClaims"]}
    requests = {r["name"] for r in template["spec"]["spec"]["devices"]["requests"]}
    for gpu in vmi["spec"]["domain"]["devices"]["gpus"]:
        assert claims[gpu["claimName"]]["resourceClaimTemplateName"] == template["metadata"]["name"]
        assert gpu["requestName"] in requests
