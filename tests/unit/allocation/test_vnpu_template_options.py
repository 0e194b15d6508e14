"""vNPU templates made at prepare, end to end on one node: the ascend discovery backend
publishes them as options over the chip's AI-core counters, the project's allocator gives a
claim that selects a template by its attributes alone one of them, and the allocation agent's
preparer makes that vNPU with (fake) npu-smi and destroys it at unprepare. The chip and a vNPU
of it are never allocated together."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from services.allocation.cdi import spec_files
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore
from services.allocation.claim.claims import ClaimReader, ClaimRef
from services.allocation.dra.preparer import ClaimPreparer
from services.allocator.allocator import allocate
from services.allocator.errors import UnsatisfiableError
from services.discovery import inventory, slices
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.ascend import discovery as ascend
from shared.vendors.ascend.partitions import VnpuPartitionManager
from shared.vendors.parts.sysfs import Sysfs
from tests.fakes.allocation_sources import FakeInventory
from tests.fakes.npusmi import FakeNpuSmi
from tests.fakes.npusmi_vnpu import FakeChip, FakeVnpuNpuSmi

DRIVER = "npu.huawei.com"
NODE = "node-a"
IDENTITY = inventory.Identity(driver=DRIVER, node=NODE, pool=NODE, backend="ascend")


def _class(expression: str) -> dict[str, Any]:
    return {"spec": {"selectors": [{"cel": {"expression": expression}}]}}


ATTRIBUTES = f'device.attributes["{DRIVER}"]'
CLASSES = {
    "chip": _class(f'{ATTRIBUTES}.chipName == "310P3"'),
    "npu": _class(f'{ATTRIBUTES}.type == "npu"'),
}


async def _published() -> tuple[inventory_pb2.Inventory, list[dict[str, Any]]]:
    """The 310P3 chip of the capture (card 7, chip 0, 8 AI cores) with its vir04 and vir02."""
    fake = FakeNpuSmi.from_fixtures("310p3-published.txt", "310p3-topo.txt")
    fake.vnpus(7, 0, "310p3-info-vnpu-host.txt")
    scan = await ascend.AscendBackend(run_command=fake, sysfs=Sysfs("/nonexistent")).scan()
    built = inventory.build(scan, identity=IDENTITY, scanned_unix_ms=1)
    pool = slices.desired(built)
    assert not pool.rejected
    published = [
        {"metadata": {"name": f"s{k}"}, "spec": pool.spec(content, generation=1)}
        for k, content in enumerate(pool.contents)
    ]
    return built, published


def _npu_smi() -> FakeVnpuNpuSmi:
    """The same chip as npu-smi's partition commands see it."""
    chip = FakeChip(card=7, chip=0, logic_id=0, phy_id=0, name="310P3", ai_cores=8)
    npu_smi = FakeVnpuNpuSmi(chips=[chip])
    npu_smi.add(7, 0, 100, "vir04")
    npu_smi.add(7, 0, 101, "vir02")
    return npu_smi


def _claim(name: str, device_class: str, selector: str = "") -> dict[str, Any]:
    request: dict[str, Any] = {"name": "npu", "exactly": {"deviceClassName": device_class}}
    if selector:
        request["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "metadata": {"name": name, "namespace": "default", "uid": name},
        "spec": {"devices": {"requests": [request]}},
    }


def _template(name: str) -> str:
    return f'has({ATTRIBUTES}.vnpuTemplate) && {ATTRIBUTES}.vnpuTemplate == "{name}"'


TEMPLATE_ONLY = _template("vir02_1c")


async def test_a_template_chosen_by_its_attributes_is_allocated_made_given_and_destroyed(
    tmp_path: Path, kube_reader: Any, make_claim: Any
) -> None:
    built, published = await _published()
    [held] = allocate(_claim("c0", "npu", TEMPLATE_ONLY), classes=CLASSES, slices=published)
    option = next(d for d in built.devices if d.name == held.device)
    assert (option.parent, option.attributes["createdOnDemand"].bool) == ("npu-0", True)

    npu_smi = _npu_smi()
    state = tmp_path / "vnpu-partitions.json"
    checkpoints = CheckpointStore(tmp_path / "checkpoint")
    checkpoints.load()
    cdi_root = tmp_path / "cdi"
    cdi_root.mkdir()
    preparer = ClaimPreparer(
        claims=ClaimReader(kube_reader, driver=DRIVER, pool=NODE),
        inventory=FakeInventory(built),
        checkpoints=checkpoints,
        cdi_writer=CDIWriter(cdi_root, driver=DRIVER),
        driver=DRIVER,
        backend="ascend",
        partitions=VnpuPartitionManager(state, run_command=npu_smi),
    )
    uid = str(uuid.uuid4())
    kube_reader.put(make_claim(uid=uid, name="vnpu", devices=[held.device], driver=DRIVER))
    ref = ClaimRef(namespace="default", name="vnpu", uid=uid)

    record = await preparer.prepare(ref)
    # Made under the agent's ids of the chip (104-107 on a 310P of physical id 0).
    assert npu_smi.on_chip(7) == {100: "vir04", 101: "vir02", 104: "vir02_1c"}
    assert [(p.device, p.profile, p.partition_id) for p in record.partitions] == [
        (held.device, "vir02_1c", "104")
    ]
    spec = json.loads((cdi_root / spec_files.spec_file_name(DRIVER, uid)).read_text())
    [device] = spec["devices"]
    env = dict(item.split("=", 1) for item in device["containerEdits"]["env"])
    assert (env["ASCEND_VISIBLE_DEVICES"], env["ASCEND_RUNTIME_OPTIONS"]) == ("104", "VIRTUAL")
    nodes = [(n["path"], n.get("hostPath", "")) for n in device["containerEdits"]["deviceNodes"]]
    assert ("/dev/davinci104", "/dev/vdavinci104") in nodes
    assert not [path for path, _ in nodes if path == "/dev/davinci0"]  # never the whole chip

    await preparer.unprepare(ref)
    assert npu_smi.on_chip(7) == {100: "vir04", 101: "vir02"}
    assert json.loads(state.read_text())["partitions"] == []


@pytest.mark.parametrize("first", ["chip", "template"])
async def test_a_chip_and_a_template_of_it_are_never_allocated_together(first: str) -> None:
    _, published = await _published()
    chip = _claim("chip", "chip")
    template = _claim("template", "npu", TEMPLATE_ONLY)
    claims = [chip, template] if first == "chip" else [template, chip]
    held = allocate(claims[0], classes=CLASSES, slices=published)
    with pytest.raises(UnsatisfiableError):
        allocate(claims[1], classes=CLASSES, slices=published, in_use=held)


async def test_templates_of_one_chip_share_its_ai_cores() -> None:
    _, published = await _published()
    four_cores = _template("vir04_3c")
    held = allocate(_claim("a", "npu", four_cores), classes=CLASSES, slices=published)
    held += allocate(_claim("b", "npu", four_cores), classes=CLASSES, slices=published, in_use=held)
    with pytest.raises(UnsatisfiableError):  # 8 AI cores: a third 4-core vNPU does not fit
        allocate(_claim("c", "npu", four_cores), classes=CLASSES, slices=published, in_use=held)
