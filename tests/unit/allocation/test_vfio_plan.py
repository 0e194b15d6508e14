"""Planning a claim for a virtual machine (`passthrough: vfio`, docs/vfio.md): the record names
each device's PCI function and IOMMU group, the CDI spec hands only `/dev/vfio/vfio` and the
device's own `/dev/vfio/<group>` on every backend, the device metadata (with the PCI address)
is written even where `--device-metadata` is off, and the allowlist refuses anything else for a
VFIO device (and `/dev/vfio` for a container device). Claims that cannot go to a VM fail with
an error that says why. The config field is in the one schema, and round-trips."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import pytest

from services.allocation.cdi import allowlist
from services.allocation.claim import checkpoint, opaque
from services.allocation.claim.checkpoint import PreparedVfio
from services.allocation.claim.claims import AllocatedClaim, ClaimRef, DeviceResult, OpaqueConfig
from services.allocation.dra import planning
from shared.errors import DeviceNotAllocatableError, InvalidOpaqueConfigError
from shared.pb.drasuite.v1 import inventory_pb2

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
UID = "7a1c0de0-0000-4000-8000-000000000001"
VFIO = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "DeviceConfig", "passthrough": "vfio"}
METADATA = PurePosixPath(f"/var/lib/kubelet/plugins/{DRIVER}/dra-device-metadata")


def _gpu(
    index: int, *, group: int | None = None, viable: bool = True, bus: str | None = None
) -> inventory_pb2.Device:
    device = inventory_pb2.Device(
        name=f"gpu-{index}",
        kind="gpu",
        uuid=f"GPU-0000000{index}-e840-51ed-b15f-0be7ae073686",
        device_nodes=[inventory_pb2.DeviceNode(path=f"/dev/nvidia{index}", host_path="/dev/null")],
        env={"NVIDIA_VISIBLE_DEVICES": str(index)},
    )
    device.attributes["type"].string = "gpu"
    device.attributes["productName"].string = "NVIDIA H100 80GB HBM3"
    if group is not None:
        device.attributes["iommuGroup"].int = group
        device.attributes["vfioViable"].bool = viable
    device.attributes["resource.kubernetes.io/pciBusID"].string = (
        bus or f"0000:{index + 0x3B:02x}:00.0"
    )
    return device


def _inventory(*devices: inventory_pb2.Device, backend: str = "sim") -> inventory_pb2.Inventory:
    return inventory_pb2.Inventory(
        driver=DRIVER, node=NODE, pool=NODE, backend=backend, devices=devices
    )


def _claim(
    *devices: str,
    configs: Mapping[str, Mapping[str, Any] | None] | None = None,
    admin: bool = False,
) -> AllocatedClaim:
    """Request `vm` gets `devices`; `configs`: request -> parameters (None: no config)."""
    configs = {"vm": VFIO} if configs is None else configs
    results = [
        DeviceResult(request=request, pool=NODE, device=device, admin_access=admin)
        for request in configs
        for device in devices
    ]
    return AllocatedClaim(
        ref=ClaimRef(namespace="default", name="vm-gpu", uid=UID),
        results=tuple(results),
        configs=tuple(
            OpaqueConfig(source="FromClaim", requests=(request,), parameters=dict(parameters))
            for request, parameters in configs.items()
            if parameters is not None
        ),
    )


def _nodes(spec: Mapping[str, Any]) -> list[dict[str, str]]:
    edits = [spec.get("containerEdits") or {}, *(d["containerEdits"] for d in spec["devices"])]
    return [node for e in edits for node in e.get("deviceNodes", [])]


@pytest.mark.parametrize("backend", ["sim", "nvml", "ascend"])
def test_a_vfio_claim_gets_only_the_vfio_nodes_and_its_metadata(backend):
    inventory = _inventory(_gpu(0, group=12), _gpu(1, group=13), backend=backend)
    if backend == "ascend":
        for device in inventory.devices:
            device.kind = "npu"
            device.name = device.name.replace("gpu", "npu")
    names = [d.name for d in inventory.devices]
    record = planning.plan(
        _claim(*names), inventory, driver=DRIVER, backend=backend, vfio_metadata_root=METADATA
    )
    assert record.vfio == (
        PreparedVfio(device=names[0], pci_bus_id="0000:3b:00.0", iommu_group=12),
        PreparedVfio(device=names[1], pci_bus_id="0000:3c:00.0", iommu_group=13),
    )
    assert record.cdi_spec is not None
    host = "/dev/null" if backend == "sim" else None
    expected = [
        {"path": "/dev/vfio/vfio", **({"hostPath": host} if host else {})},
        {"path": "/dev/vfio/12", **({"hostPath": host} if host else {})},
        {"path": "/dev/vfio/13", **({"hostPath": host} if host else {})},
    ]
    assert _nodes(record.cdi_spec) == expected
    for device in record.cdi_spec["devices"]:
        env = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
        assert env == {"DRA_SUITE_CLAIM_UID": UID, "DRA_SUITE_DEVICES": ",".join(names)}
    # The VM's launcher finds the PCI address in the metadata, written with the setting off.
    (document,) = record.device_metadata.values()
    (request,) = document["requests"]
    assert [d["attributes"]["resource.kubernetes.io/pciBusID"] for d in request["devices"]] == [
        {"string": "0000:3b:00.0"},
        {"string": "0000:3c:00.0"},
    ]
    assert record.device_configs["vm"]["passthrough"] == "vfio"
    assert checkpoint.decode(checkpoint.encode(record), path=None) == record  # type: ignore[arg-type]


def test_a_claim_for_containers_is_planned_as_before():
    record = planning.plan(
        _claim("gpu-0", configs={"vm": None}),
        _inventory(_gpu(0, group=12)),
        driver=DRIVER,
        backend="sim",
        vfio_metadata_root=METADATA,
    )
    assert record.vfio == ()
    assert record.device_metadata == {}
    assert "/dev/nvidia0" in [n["path"] for n in _nodes(record.cdi_spec or {})]


@pytest.mark.parametrize(
    ("configs", "match"),
    [
        ({"vm": VFIO, "ctr": None}, "a claim is for one or the other"),
        (
            {"vm": VFIO | {"sharing": {"strategy": "TimeSlicing"}}},
            "must not share it",
        ),
        ({"vm": VFIO | {"partition": {"profile": "1g.10gb"}}}, "nor partition it"),
    ],
    ids=["mixed", "shared", "partitioned"],
)
def test_a_claim_that_cannot_go_to_a_vm_fails_with_its_config_s_field(configs, match):
    with pytest.raises(InvalidOpaqueConfigError, match=match) as raised:
        planning.plan(
            _claim("gpu-0", configs=configs),
            _inventory(_gpu(0, group=12)),
            driver=DRIVER,
            backend="sim",
        )
    assert raised.value.field == "passthrough"


def test_admin_access_cannot_pass_a_device_through():
    with pytest.raises(InvalidOpaqueConfigError, match="admin access"):
        planning.plan(
            _claim("gpu-0", admin=True), _inventory(_gpu(0, group=12)), driver=DRIVER, backend="sim"
        )


@pytest.mark.parametrize(
    ("device", "match"),
    [
        (_gpu(0), "iommuGroup=\\(none\\)"),
        (_gpu(0, group=12, viable=False), "vfioViable=False"),
        (_gpu(0, group=12, bus="../../x"), "pciBusID=../../x"),
    ],
    ids=["no-group", "not-viable", "bad-address"],
)
def test_a_device_without_a_viable_group_fails(device, match):
    with pytest.raises(DeviceNotAllocatableError, match=match):
        planning.plan(_claim("gpu-0"), _inventory(device), driver=DRIVER, backend="sim")


def test_a_partition_never_passes_through():
    mig = _gpu(0, group=12)
    mig.name, mig.kind, mig.parent = "gpu-0-mig-1g10gb-19-3", "mig", "gpu-0"
    with pytest.raises(DeviceNotAllocatableError, match="only a whole device"):
        planning.plan(_claim(mig.name), _inventory(mig), driver=DRIVER, backend="sim")


@pytest.mark.parametrize(
    ("nodes", "env", "kind"),
    [
        ([("/dev/nvidia0", "")], {}, "device_node"),
        ([("/dev/vfio/13", "")], {}, "device_node"),
        ([("/dev/vfio/12", "/dev/sda")], {}, "host_path"),
        ([], {"NVIDIA_VISIBLE_DEVICES": "0"}, "env_name"),
    ],
    ids=["vendor-node", "other-group", "host-path", "vendor-env"],
)
def test_the_allowlist_gives_a_vfio_device_nothing_but_its_vfio_nodes(nodes, env, kind):
    edits = allowlist.DeviceEdits(
        device="gpu-0",
        nodes=nodes,
        env=env,
        own=allowlist.Own(nodes=frozenset({"/dev/vfio/12"})),
        vfio=True,
    )
    with pytest.raises(allowlist.ForbiddenEditError) as raised:
        allowlist.check(backend="nvml", claim_uid=UID, devices=[edits])
    assert [r.kind for r in raised.value.rejected] == [kind]
    ok = allowlist.DeviceEdits(
        device="gpu-0",
        nodes=[("/dev/vfio/12", ""), ("/dev/vfio/vfio", "")],
        env={"DRA_SUITE_CLAIM_UID": UID},
        own=allowlist.Own(nodes=frozenset({"/dev/vfio/12"})),
        vfio=True,
    )
    allowlist.check(backend="nvml", claim_uid=UID, devices=[ok])


@pytest.mark.parametrize("backend", ["nvml", "ascend", "sim"])
def test_a_container_device_never_gets_vfio_nodes(backend):
    edits = allowlist.DeviceEdits(
        device="gpu-0", nodes=[("/dev/vfio/vfio", "/dev/null" if backend == "sim" else "")], env={}
    )
    with pytest.raises(allowlist.ForbiddenEditError):
        allowlist.check(backend=backend, claim_uid=UID, devices=[edits])


def test_passthrough_is_in_the_one_schema():
    config = opaque.decode(VFIO, driver=DRIVER)
    assert config.passthrough == "vfio"
    assert opaque.decode(opaque.encode(config, driver=DRIVER), driver=DRIVER) == config
    with pytest.raises(InvalidOpaqueConfigError) as raised:
        opaque.decode(VFIO | {"passthrough": "pci"}, driver=DRIVER)
    assert raised.value.field == "passthrough"
