"""Static vNPUs from the host's view (`npu-smi info -t info-vnpu`), and the counters that keep
the scheduler from allocating a chip together with a vNPU of it (docs/hardware.md §3.6).

The last tests run the published slices through the project's model of kube-scheduler's
allocator (`services.allocator`), so "cannot both be allocated" is the scheduler's verdict,
not just counter arithmetic.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.allocator.allocator import allocate
from services.allocator.errors import UnsatisfiableError
from services.allocator.result import AllocationResult
from services.discovery import inventory, slices
from shared.errors import BackendUnavailableError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.ascend import discovery as ascend
from shared.vendors.parts.sysfs import Sysfs
from tests.fakes.npusmi import FakeNpuSmi

DRIVER = "npu.huawei.com"
NODE = "n1"
IDENTITY = inventory.Identity(driver=DRIVER, node=NODE, pool=NODE, backend="ascend")


def _fake(view: str | None = "310p3-info-vnpu-host.txt") -> FakeNpuSmi:
    fake = FakeNpuSmi.from_fixtures("310p3-published.txt", "310p3-topo.txt")
    if view is not None:
        fake.vnpus(7, 0, view)  # card 7, chip 0: the 310P3 of the capture
    return fake


async def _scan(fake: FakeNpuSmi) -> Any:
    return await ascend.AscendBackend(run_command=fake, sysfs=Sysfs("/nonexistent")).scan()


def _by_name(devices: Any) -> dict[str, inventory_pb2.Device]:
    return {device.name: device for device in devices}


async def test_static_vnpus_of_the_host_view_are_published_as_partitions_of_their_chip():
    fake = _fake()
    scan = await _scan(fake)
    devices = _by_name(d for d in scan.devices if "createdOnDemand" not in d.attributes)
    assert list(devices) == ["npu-0", "npu-0-vnpu-100", "npu-0-vnpu-101"]
    assert ("npu-smi", "info", "-t", "info-vnpu", "-i", "7", "-c", "0") in fake.calls
    vnpu = devices["npu-0-vnpu-100"]
    assert vnpu.parent == "npu-0"
    assert vnpu.kind == "npu"
    assert vnpu.attributes["chipName"].string == "310P3vir04"  # what the template classes read
    assert vnpu.attributes["vnpuTemplate"].string == "vir04"
    assert vnpu.attributes["index"].int == 100
    assert (vnpu.attributes["cardId"].int, vnpu.attributes["chipId"].int) == (7, 0)
    assert dict(vnpu.capacity) == {"aiCore": "4"}
    node = vnpu.device_nodes[0]
    assert (node.path, node.host_path) == ("/dev/davinci100", "/dev/vdavinci100")
    assert dict(vnpu.env) == {"ASCEND_VISIBLE_DEVICES": "100", "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"}


async def test_the_chip_consumes_its_whole_counter_set_and_each_vnpu_its_templates_share():
    scan = await _scan(_fake())
    (counters,) = scan.shared_counters
    assert (counters.name, dict(counters.counters)) == ("npu-0-counter-set", {"ai-cores": "8"})
    uses = {
        d.name: [(c.counter_set, dict(c.counters)) for c in d.consumes_counters]
        for d in scan.devices
        if "createdOnDemand" not in d.attributes
    }
    assert uses == {
        "npu-0": [("npu-0-counter-set", {"ai-cores": "8"})],
        "npu-0-vnpu-100": [("npu-0-counter-set", {"ai-cores": "4"})],  # vir04
        "npu-0-vnpu-101": [("npu-0-counter-set", {"ai-cores": "2"})],  # vir02
    }


async def test_a_chip_with_the_vnpu_view_offers_its_models_templates_made_at_prepare():
    scan = await _scan(_fake())  # the 310P3 chip: 8 AI cores, a vir04 and a vir02 made
    (counters,) = scan.shared_counters
    assert dict(counters.counters) == {"ai-cores": "8"}
    options = [d for d in scan.devices if "createdOnDemand" in d.attributes]
    by_template: dict[str, list[str]] = {}
    for option in options:
        assert option.attributes["createdOnDemand"].bool
        assert option.parent == "npu-0"
        template = option.attributes["vnpuTemplate"].string
        assert option.attributes["profile"].string == template
        assert option.attributes["chipName"].string == f"310P3{template}"
        assert (option.uuid, list(option.device_nodes), dict(option.env)) == ("", [], {})
        assert "index" not in option.attributes
        [use] = option.consumes_counters
        assert dict(use.counters) == {"ai-cores": str(int(template[3:5]))}
        by_template.setdefault(template, []).append(option.name)
    # As many of each as the agent's 4 ids of a 310P chip and its 8 AI cores hold.
    assert {t: len(names) for t, names in by_template.items()} == {
        "vir01": 4,
        "vir02": 4,
        "vir04": 2,
        "vir02_1c": 4,
        "vir04_3c": 2,
        "vir04_3c_ndvpp": 2,
        "vir04_4c_dvpp": 2,
    }
    assert by_template["vir02_1c"][0] == "npu-0-vnpu-vir02-1c-0"


def _static(scan: Any) -> list[str]:
    return [d.name for d in scan.devices if "createdOnDemand" not in d.attributes]


async def test_a_vnpu_made_for_a_claim_is_published_as_nothing_but_its_option():
    # The agent makes a claim's vNPU under the upper half of the chip's ids (104-107 on a
    # 310P chip of physical id 0): discovery's scans before, while and after the claim holds
    # it publish the same devices, so none names a vNPU that unprepare destroyed and no other
    # claim can get the claim's vNPU as a static one.
    key = ("info", "-t", "info-vnpu", "-i", "7", "-c", "0")
    made_for_claim = _fake()
    made_for_claim.outputs[key] = made_for_claim.outputs[key].replace("|  100 ", "|  104 ")
    not_yet = _fake()
    rows = not_yet.outputs[key].splitlines(keepends=True)
    not_yet.outputs[key] = "".join(r for r in rows if "|  100 " not in r).replace(
        "vnpu: 2", "vnpu: 1"
    )
    during, before = await _scan(made_for_claim), await _scan(not_yet)
    assert _static(during) == _static(before) == ["npu-0", "npu-0-vnpu-101"]
    assert during == before


@pytest.mark.parametrize("view", [None, "310p3-published.txt"], ids=str)
async def test_a_chip_without_a_vnpu_view_has_no_counters(view):
    scan = await _scan(_fake(view))
    assert [d.name for d in scan.devices] == ["npu-0"]
    assert scan.shared_counters == ()
    assert not scan.devices[0].consumes_counters


async def test_a_vnpu_table_that_does_not_add_up_fails_the_scan():
    fake = _fake()
    key = ("info", "-t", "info-vnpu", "-i", "7", "-c", "0")
    fake.outputs[key] = fake.outputs[key].replace("vnpu: 2", "vnpu: 3")
    with pytest.raises(BackendUnavailableError, match="says 3 vNPUs but lists 2"):
        await _scan(fake)


# The scheduler's verdict, on the slices discovery publishes.


def _class(expression: str) -> dict[str, Any]:
    return {"spec": {"selectors": [{"cel": {"expression": expression}}]}}


CHIP_NAME = f'device.attributes["{DRIVER}"].chipName'
CLASSES = {
    "chip": _class(f'{CHIP_NAME} == "310P3"'),
    # As deploy/kustomize/overlays/ascend/deviceclasses.yaml selects static vNPUs.
    "vir04": _class(f'{CHIP_NAME}.endsWith("vir04")'),
    "vir02": _class(f'{CHIP_NAME}.endsWith("vir02")'),
}


async def _published_slices() -> list[dict[str, Any]]:
    built = inventory.build(await _scan(_fake()), identity=IDENTITY, scanned_unix_ms=1)
    pool = slices.desired(built)
    assert not pool.rejected
    assert not pool.withheld
    return [
        {"metadata": {"name": f"s{k}"}, "spec": pool.spec(content, generation=1)}
        for k, content in enumerate(pool.contents)
    ]


def _claim(name: str, device_class: str) -> dict[str, Any]:
    request = {"name": "r", "exactly": {"deviceClassName": device_class}}
    return {
        "metadata": {"name": name, "namespace": "default", "uid": name},
        "spec": {"devices": {"requests": [request]}},
    }


def _allocate(
    slices_: list[dict[str, Any]], device_class: str, held: list[AllocationResult]
) -> list[AllocationResult]:
    return allocate(
        _claim(f"c{len(held)}", device_class), classes=CLASSES, slices=slices_, in_use=held
    )


@pytest.mark.parametrize(
    ("first", "then"),
    [("chip", "vir04"), ("chip", "vir02"), ("vir04", "chip"), ("vir02", "chip")],
    ids=["chip-then-vnpu", "chip-then-other-vnpu", "vnpu-then-chip", "other-vnpu-then-chip"],
)
async def test_a_chip_and_a_vnpu_of_it_are_never_allocated_together(first, then):
    published = await _published_slices()
    held = _allocate(published, first, [])
    assert len(held) == 1
    with pytest.raises(UnsatisfiableError):
        _allocate(published, then, held)


async def test_vnpus_of_one_chip_are_allocated_side_by_side():
    published = await _published_slices()
    held = _allocate(published, "vir04", [])
    held += _allocate(published, "vir02", held)
    assert sorted(r.device for r in held) == ["npu-0-vnpu-100", "npu-0-vnpu-101"]
    with pytest.raises(UnsatisfiableError):  # the chip, for a vNPU made at prepare time
        _allocate(published, "chip", held)
