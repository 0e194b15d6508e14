"""`dractl classes generate` (services/dractl/classgen.py) over the slices a realistic fleet
publishes: sim nodes of the shipped profiles (NPUs of two models, whole GPUs, MIG placements,
a shared GPU) and an Ascend node with static vNPUs, each as the discovery agent publishes it
for the Kubernetes version. The generated selectors run
through the allocator's CEL (services/allocator/selector.py): every device is selected by
exactly the class expected for it, every class selects a device. The classes validate against
the version's API schemas and the emulator's DeviceClass rules, and pass the shipped admission
policies."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from devcluster.apiserver import claim_rules, naming
from devcluster.apiserver.schema import schema_set
from services.allocator import selector
from services.allocator.device import Device
from services.allocator.pool import Inventory
from services.discovery import apirules
from services.dractl import classgen
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.discovery import Scan
from shared.vendors.sim.discovery import SimBackend
from tests.unit.allocator.sim_cluster import scan_slices
from tests.unit.deploy.manifests import (
    admission_policy,
    admission_request,
    evaluate_policy,
    policy_with_driver,
)

SIM = "sim.dra-suite.io"
ASCEND = "npu.huawei.com"
MINORS = (34, 35, 36, 37)
SIM_NODES = {
    "node-a": "mixed",
    "node-b": "gpu-mig",
    "node-c": "gpu-shared",
    "node-d": "ascend-310p-duo",
}
H100 = "nvidia-h100-80gb-hbm3"
Obj = dict[str, Any]
# k8s.io/apimachinery IsQualifiedName of "requests.<name>" (core/v1 helper IsExtendedResourceName)
EXTENDED_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def _slices(scan: Scan, *, driver: str, node: str, backend: str, minor: int) -> list[Obj]:
    rules = apirules.for_minor(minor)
    return scan_slices(scan, node=node, driver=driver, backend=backend, rules=rules)


def ascend_scan() -> Scan:
    """A 310P3 chip with two static vNPUs (templates vir04 and vir02) over its AI-core counter
    set, with the attributes the Ascend backend gives them (services/discovery/backends/
    ascend.py: a vNPU is a partition of its chip, `chipName` the chip's and the template,
    `vnpuTemplate` the template)."""
    counters = inventory_pb2.CounterSet(name="npu-0-counter-set", counters={"ai-cores": "8"})
    chip = inventory_pb2.Device(name="npu-0", kind="npu", capacity={"aiCore": "8"})
    for key, value in (("type", "npu"), ("chipName", "310P3"), ("topologyGroup", "hccs-0")):
        chip.attributes[key].string = value
    for key, number in (("index", 0), ("physicalId", 0), ("cardId", 7), ("chipId", 0)):
        chip.attributes[key].int = number
    chip.consumes_counters.add(counter_set=counters.name, counters={"ai-cores": "8"})
    devices = [chip]
    for vnpu, template, cores in ((100, "vir04", "4"), (101, "vir02", "2")):
        device = inventory_pb2.Device(
            name=f"npu-0-vnpu-{vnpu}", kind="npu", parent=chip.name, capacity={"aiCore": cores}
        )
        for key, attribute in chip.attributes.items():
            device.attributes[key].CopyFrom(attribute)
        device.attributes["chipName"].string = f"310P3{template}"
        device.attributes["vnpuTemplate"].string = template
        device.attributes["index"].int = vnpu
        device.consumes_counters.add(counter_set=counters.name, counters={"ai-cores": cores})
        devices.append(device)
    return Scan(devices=tuple(devices), shared_counters=(counters,))


async def fleet_slices(minor: int) -> list[Obj]:
    """Four sim nodes of the shipped profiles and one Ascend 310P3 node with two static vNPUs,
    as published to a server of Kubernetes 1.`minor`."""
    published: list[Obj] = []
    for node, profile in SIM_NODES.items():
        scan = await SimBackend.from_profile(profile).scan()
        published += _slices(scan, driver=SIM, node=node, backend="sim", minor=minor)
    published += _slices(ascend_scan(), driver=ASCEND, node="node-e", backend="ascend", minor=minor)
    return published


async def _fleet(minor: int) -> list[Device]:
    return Inventory(await fleet_slices(minor)).devices()


def _attribute(device: Device, name: str) -> Any:
    return device.attribute(f"{device.driver}/{name}")


def _expected(device: Device, minor: int) -> str:
    """The one class each device of the fleet belongs in, by the documented names."""
    kind = _attribute(device, "type")
    if device.driver == ASCEND:
        template = _attribute(device, "vnpuTemplate")
        return f"{template or _attribute(device, 'chipName').lower()}.{ASCEND}"  # no 2nd "npu"
    if kind == "mig":
        return f"mig-{_attribute(device, 'profile')}.{SIM}"
    if kind == "gpu":
        shared = device.multiple_allocations and minor >= 36
        return f"{'shared.' if shared else ''}{H100}.gpu.{SIM}"
    return f"{_attribute(device, 'chipName').lower()}.npu.{SIM}"


def _selects(device_class: Obj, device: Device) -> bool:
    outcomes = [
        selector.evaluate(s["cel"]["expression"], device) for s in device_class["spec"]["selectors"]
    ]
    assert not [o.error for o in outcomes if o.error], device.name
    return all(o.matches for o in outcomes)


@pytest.mark.parametrize("minor", MINORS, ids=[f"1.{m}" for m in MINORS])
async def test_every_device_is_selected_by_exactly_the_class_of_its_kind(minor: int):
    devices = await _fleet(minor)
    generated = classgen.generate(devices, minor=minor)
    for device_class in generated.classes:
        for s in device_class["spec"]["selectors"]:
            assert selector.check(s["cel"]["expression"]) == ""
    selected_by: dict[str, set[str]] = {}
    for device in devices:
        key = f"{device.driver}/{device.pool}/{device.name}"
        selected_by[key] = {c["metadata"]["name"] for c in generated.classes if _selects(c, device)}
        assert selected_by[key] == {_expected(device, minor)}, key
    for device_class in generated.classes:
        name = device_class["metadata"]["name"]
        assert any(name in names for names in selected_by.values()), f"{name} selects nothing"
        assert set(generated.selected[name]) == {k for k, v in selected_by.items() if name in v}
    assert generated.notes == ()


async def test_the_classes_of_the_fleet_by_version():
    names = {
        minor: [c["metadata"]["name"] for c in classgen.generate(devices, minor=minor).classes]
        for minor in (35, 36)
        for devices in [await _fleet(minor)]
    }
    whole = [f"310p3.{ASCEND}", f"310p3.npu.{SIM}", f"910b4.npu.{SIM}", f"{H100}.gpu.{SIM}"]
    partitions = [f"mig-{p}.{SIM}" for p in ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb")]
    vnpus = [f"vir02.{ASCEND}", f"vir04.{ASCEND}"]
    # Shared devices are published from 1.36 (consumable capacity), and selectable from 1.36.
    assert names[35] == sorted([*whole, *partitions, *vnpus])
    assert names[36] == sorted([*whole, *partitions, *vnpus, f"shared.{H100}.gpu.{SIM}"])


@pytest.mark.parametrize("minor", MINORS, ids=[f"1.{m}" for m in MINORS])
async def test_the_classes_validate_against_the_api_of_the_version(minor: int):
    generated = classgen.generate(await _fleet(minor), minor=minor)
    schemas = schema_set(f"1.{minor}")
    resources = classgen.extended_resources(generated.classes)
    for device_class in generated.classes:
        name = device_class["metadata"]["name"]
        assert schemas.validate(device_class) == [], name
        assert claim_rules.validate_device_class(device_class, None, minor) == [], name
        assert naming.dns_subdomain("metadata.name", name) == [], name
        for key, value in device_class["metadata"].get("labels", {}).items():
            assert naming.label_name("metadata.labels", key) == []
            assert naming.label_value("metadata.labels", value) == []
        for key in device_class["metadata"].get("annotations", {}):
            assert naming.label_name("metadata.annotations", key) == []
        assert "config" not in device_class["spec"]  # the devices define their partitions
    # KEP-5004 extended resources: the gate is on from 1.36; unique names, valid ones.
    if minor < 36:
        assert resources == {}
    else:
        assert set(resources) == {c["metadata"]["name"] for c in generated.classes}
        assert len(set(resources.values())) == len(resources)
        for value in resources.values():
            assert EXTENDED_RESOURCE.match(value), value
            assert len(value.split("/", 1)[1]) <= 63
            assert "kubernetes.io" not in value
    if minor >= 36:
        assert resources[f"mig-1g.10gb.{SIM}"] == f"{SIM}/mig-1g.10gb"
        assert resources[f"vir04.{ASCEND}"] == f"{ASCEND}/vir04"
        assert resources[f"{H100}.gpu.{SIM}"] == f"{SIM}/gpu-{H100}"
        assert resources[f"shared.{H100}.gpu.{SIM}"] == f"{SIM}/shared-gpu-{H100}"


async def test_the_classes_pass_the_shipped_admission_policies():
    generated = classgen.generate(await _fleet(37), minor=37)
    policy = admission_policy("deviceconfig.yaml", "dra-suite-deviceconfig")
    for driver in (SIM, ASCEND):
        bound = policy_with_driver(policy, driver)
        for device_class in generated.classes:
            for operation in ("CREATE", "UPDATE"):
                request = admission_request(
                    resource="deviceclasses",
                    operation=operation,
                    obj=device_class,
                    old=device_class if operation == "UPDATE" else None,
                )
                verdict = evaluate_policy(bound, request)
                assert verdict.allowed, (device_class["metadata"]["name"], verdict.denials)


async def test_the_output_is_the_same_whatever_order_the_devices_come_in():
    devices = await _fleet(37)
    first = classgen.generate(devices, minor=37)
    shuffled = list(devices)
    random.Random(7).shuffle(shuffled)
    assert classgen.generate(shuffled, minor=37).classes == first.classes


async def test_the_device_plugin_resource_of_each_class():
    generated = classgen.generate(await _fleet(37), minor=37)
    annotations = {
        c["metadata"]["name"]: c["metadata"]
        .get("annotations", {})
        .get(classgen.ANNOTATION_DEVICE_PLUGIN)
        for c in generated.classes
    }
    assert annotations[f"310p3.{ASCEND}"] == "huawei.com/Ascend310P"
    assert annotations[f"vir04.{ASCEND}"] == "huawei.com/Ascend310P-4c"
    assert annotations[f"vir02.{ASCEND}"] == "huawei.com/Ascend310P-2c"
    assert annotations[f"910b4.npu.{SIM}"] == f"{SIM}/npu"
    assert annotations[f"{H100}.gpu.{SIM}"] == f"{SIM}/gpu"
    # MIG placements made on demand are not offered on the device-plugin front.
    assert annotations[f"mig-1g.10gb.{SIM}"] is None
    # A driver whose backend is unknown gets no annotation rather than a wrong one.
    renamed = [_renamed(d, "gpu.example.com") for d in await _fleet(37) if d.driver == SIM]
    unknown = classgen.generate(renamed, minor=37)
    assert all("annotations" not in c["metadata"] for c in unknown.classes)
    told = classgen.generate(renamed, minor=37, backends={"gpu.example.com": "sim"})
    assert "gpu.example.com/npu" in {
        c["metadata"].get("annotations", {}).get(classgen.ANNOTATION_DEVICE_PLUGIN)
        for c in told.classes
    }


def _renamed(device: Device, driver: str) -> Device:
    prefix = f"{device.driver}/"
    attributes = {
        (f"{driver}/{k.removeprefix(prefix)}" if k.startswith(prefix) else k): v
        for k, v in device.attributes.items()
    }
    return Device(
        driver=driver,
        pool=device.pool,
        name=device.name,
        attributes=attributes,
        capacity={},
        multiple_allocations=device.multiple_allocations,
    )


def _device(
    name: str, *, driver: str = "gpu.dra-suite.io", shared: bool = False, **attributes: Any
) -> Device:
    typed = {
        f"{driver}/{k}": (
            {"bool": v}
            if isinstance(v, bool)
            else {"int": v}
            if isinstance(v, int)
            else {"string": v}
        )
        for k, v in attributes.items()
    }
    return Device(
        driver=driver,
        pool="node-x",
        name=name,
        attributes=typed,
        capacity={},
        multiple_allocations=shared,
    )


def test_an_existing_mig_device_on_nvml_is_offered_as_its_profile():
    devices = [
        _device("gpu-0", type="gpu", productName="NVIDIA A100-SXM4-80GB", uuid="GPU-1"),
        _device(
            "gpu-0-mig-1g10gb-19-0",
            type="mig",
            productName="NVIDIA A100-SXM4-80GB",
            profile="1g.10gb",
            uuid="MIG-1",
            parentUUID="GPU-1",
        ),
        _device(
            "gpu-0-mig-1g10gb-19-1",
            type="mig",
            productName="NVIDIA A100-SXM4-80GB",
            profile="1g.10gb",
            createdOnDemand=True,
            parentUUID="GPU-1",
        ),
    ]
    generated = classgen.generate(devices, minor=36)
    by_name = {c["metadata"]["name"]: c for c in generated.classes}
    assert sorted(by_name) == [
        "mig-1g.10gb.gpu.dra-suite.io",  # the nvidia overlay's names
        "nvidia-a100-sxm4-80gb.gpu.dra-suite.io",
    ]
    mig = by_name["mig-1g.10gb.gpu.dra-suite.io"]
    assert mig["metadata"]["annotations"] == {
        classgen.ANNOTATION_DEVICE_PLUGIN: "nvidia.com/mig-1g.10gb"
    }
    assert mig["spec"]["extendedResourceName"] == "gpu.dra-suite.io/mig-1g.10gb"
    gpu = by_name["nvidia-a100-sxm4-80gb.gpu.dra-suite.io"]
    assert gpu["metadata"]["annotations"] == {classgen.ANNOTATION_DEVICE_PLUGIN: "nvidia.com/gpu"}


def test_a_partition_of_the_same_type_and_model_is_kept_out_of_the_model_class():
    devices = [
        _device("npu-0", driver=SIM, type="npu", chipName="910B4"),
        _device(
            "npu-0-vnpu-1", driver=SIM, type="npu", chipName="910B4", vnpuTemplate="vir05_1c_8g"
        ),
    ]
    generated = classgen.generate(devices, minor=37)
    by_name = {c["metadata"]["name"]: c for c in generated.classes}
    assert sorted(by_name) == [f"910b4.npu.{SIM}", f"vir05-1c-8g.npu.{SIM}"]
    for device in devices:
        assert [n for n, c in by_name.items() if _selects(c, device)] == [
            f"vir05-1c-8g.npu.{SIM}" if "vnpu" in device.name else f"910b4.npu.{SIM}"
        ]
    assert by_name[f"vir05-1c-8g.npu.{SIM}"]["spec"]["extendedResourceName"] == f"{SIM}/vir05_1c_8g"


def test_values_that_give_one_name_and_overlong_values_get_valid_distinct_names():
    long_model = "X" * 80
    devices = [
        _device("a", type="gpu", productName="Model A+B"),
        _device("b", type="gpu", productName="Model A-B"),
        _device("c", type="gpu", productName=long_model),
        _device("d", type="gpu"),  # no model attribute
        _device("e", type="mig", profile="1g.10gb+me", productName="Model A+B"),
    ]
    generated = classgen.generate(devices, minor=37)
    names = [c["metadata"]["name"] for c in generated.classes]
    assert len(set(names)) == len(devices)
    resources = classgen.extended_resources(generated.classes)
    assert len(set(resources.values())) == len(devices)
    for device_class in generated.classes:
        assert naming.dns_subdomain("metadata.name", device_class["metadata"]["name"]) == []
        assert EXTENDED_RESOURCE.match(device_class["spec"]["extendedResourceName"])
        assert len(device_class["spec"]["extendedResourceName"].split("/")[1]) <= 63
    for device in devices:
        assert len([c for c in generated.classes if _selects(c, device)]) == 1, device.name
    assert "unknown-model.gpu.dra-suite.io" in names
    assert "mig-1g.10gb-me.gpu.dra-suite.io" in names
    # Deterministic: the same fleet, the same names.
    assert [
        c["metadata"]["name"] for c in classgen.generate(devices[::-1], minor=37).classes
    ] == names


def test_a_string_with_quotes_is_a_valid_cel_literal():
    device = _device("a", type="gpu", productName='Model "Q" \\ 1')
    (device_class,) = classgen.generate([device], minor=37).classes
    assert _selects(device_class, device)
    assert not _selects(device_class, _device("b", type="gpu", productName="Model Q 1"))


def test_shared_devices_before_1_36_are_in_the_exclusive_class_with_a_note():
    devices = [
        _device("gpu-0", driver=SIM, type="gpu", productName="H100", shared=True),
        _device("gpu-1", driver=SIM, type="gpu", productName="H100"),
    ]
    old = classgen.generate(devices, minor=35)
    (device_class,) = old.classes
    assert (
        "allowMultipleAllocations" not in device_class["spec"]["selectors"][0]["cel"]["expression"]
    )
    assert all(_selects(device_class, d) for d in devices)
    (note,) = old.notes
    assert "1 devices allow multiple allocations" in note
    assert f"{SIM}/node-x/gpu-0" in note
    new = classgen.generate(devices, minor=36)
    assert [c["metadata"]["name"] for c in new.classes] == [
        f"h100.gpu.{SIM}",
        f"shared.h100.gpu.{SIM}",
    ]
    assert new.notes == ()


def test_a_device_without_a_type_is_in_no_class_and_noted():
    devices = [_device("odd", productName="H100"), _device("gpu-0", type="gpu", productName="H100")]
    generated = classgen.generate(devices, minor=37)
    assert [c["metadata"]["name"] for c in generated.classes] == ["h100.gpu.dra-suite.io"]
    (note,) = generated.notes
    assert "gpu.dra-suite.io/node-x/odd" in note
