"""What a claim prepared for a virtual machine needs (pure; docs/vfio.md).

A request whose DeviceConfig in force says `passthrough: vfio` is a VFIO request. A claim is
prepared for a VM or for containers, never both: every result must be of a VFIO request, or
none. Each device must be a whole device (no partition, no option made on demand, no share of a
multi-allocatable device), allocated without admin access, whose request neither shares it
(`sharing.strategy` other than Exclusive) nor partitions it; and the inventory must publish its
PCI function (`resource.kubernetes.io/pciBusID`), its IOMMU group (`iommuGroup`) and that the
group may pass through (`vfioViable: true`). The allocation agent checks the group again in
sysfs before it unbinds anything (`binder`): the inventory is not trusted with that.

The CDI edits (`claim_edits`): per device `/dev/vfio/<group>`, once per spec `/dev/vfio/vfio`,
the host path the same (the sim backend's `/dev/null`), and only the driver's own variables
(`DRA_SUITE_CLAIM_UID`, `DRA_SUITE_DEVICES`); checked by `allowlist.vfio_rules`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.allocation.cdi import allowlist, spec_files
from services.allocation.cdi.edits import CLAIM_UID_ENV, DEVICES_ENV, ClaimEdits
from services.allocation.claim import opaque
from services.allocation.claim.checkpoint import PreparedVfio
from services.allocation.claim.claims import DeviceResult
from services.allocation.claim.config_schema import PASSTHROUGH_VFIO, Strategy
from shared.errors import DeviceNotAllocatableError, InvalidOpaqueConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.partitions import ON_DEMAND
from shared.vfio import pci

__all__ = [
    "IOMMU_GROUP",
    "PCI_BUS_ID",
    "VFIO_CONTROL_NODE",
    "VFIO_VIABLE",
    "claim_edits",
    "group_node",
    "targets",
    "vfio_requests",
]

PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
IOMMU_GROUP = "iommuGroup"
VFIO_VIABLE = "vfioViable"
VFIO_CONTROL_NODE = "/dev/vfio/vfio"

Resolved = Sequence[tuple[DeviceResult, inventory_pb2.Device]]


def group_node(group: int) -> str:
    return f"/dev/vfio/{group}"


def vfio_requests(configs: Mapping[str, opaque.DeviceConfig]) -> frozenset[str]:
    return frozenset(r for r, c in configs.items() if c.passthrough == PASSTHROUGH_VFIO)


def targets(
    resolved: Resolved, configs: Mapping[str, opaque.DeviceConfig], *, claim_uid: str
) -> tuple[PreparedVfio, ...]:
    """The devices to bind to vfio-pci, in allocation order; () for a claim for containers.
    Raises the claim's error for a claim that cannot be prepared for a VM."""
    wanted = vfio_requests(configs)
    if not any(result.request in wanted for result, _ in resolved):
        return ()
    found: dict[str, PreparedVfio] = {}
    for result, device in resolved:
        if result.request not in wanted:
            raise InvalidOpaqueConfigError(
                f"prepare claim {claim_uid}: request {result.request} is for containers, but "
                f"request(s) {', '.join(sorted(wanted))} of the same claim pass devices through "
                "to a virtual machine (passthrough: vfio): a claim is for one or the other",
                claim_uid=claim_uid,
                field="passthrough",
            )
        _check_config(result, configs[result.request], claim_uid=claim_uid)
        _check_whole(result, device, claim_uid=claim_uid)
        found.setdefault(device.name, _target(device, claim_uid=claim_uid))
    return tuple(found.values())


def _check_config(result: DeviceResult, config: opaque.DeviceConfig, *, claim_uid: str) -> None:
    if config.strategy is not Strategy.EXCLUSIVE or config.partition_profile is not None:
        raise InvalidOpaqueConfigError(
            f"prepare claim {claim_uid}: request {result.request} passes its devices through "
            "to a virtual machine (passthrough: vfio), which gets each device whole: its config "
            "must not share it (sharing.strategy) nor partition it (partition.profile)",
            claim_uid=claim_uid,
            field="passthrough",
        )
    if result.admin_access:
        raise InvalidOpaqueConfigError(
            f"prepare claim {claim_uid}: request {result.request} has admin access to "
            f"{result.device}, which gets the device as it is: it cannot pass it through to a "
            "virtual machine (passthrough: vfio)",
            claim_uid=claim_uid,
            field="passthrough",
        )


def _check_whole(result: DeviceResult, device: inventory_pb2.Device, *, claim_uid: str) -> None:
    attributes = device.attributes
    on_demand = ON_DEMAND in attributes and attributes[ON_DEMAND].bool
    if device.parent or on_demand or result.share_id is not None or result.consumed_capacity:
        raise DeviceNotAllocatableError(
            f"prepare claim {claim_uid}: device {device.name} is a partition or a share of a "
            "device; only a whole device passes through to a virtual machine (passthrough: vfio)",
            claim_uid=claim_uid,
            device=device.name,
        )


def _target(device: inventory_pb2.Device, *, claim_uid: str) -> PreparedVfio:
    attributes = device.attributes
    bus_id = attributes[PCI_BUS_ID].string.lower() if PCI_BUS_ID in attributes else ""
    has_group = IOMMU_GROUP in attributes and attributes[IOMMU_GROUP].WhichOneof("value") == "int"
    viable = VFIO_VIABLE in attributes and attributes[VFIO_VIABLE].bool
    if not pci.is_bdf(bus_id) or not has_group or not viable:
        raise DeviceNotAllocatableError(
            f"prepare claim {claim_uid}: device {device.name} cannot pass through to a virtual "
            f"machine: the inventory publishes {PCI_BUS_ID}={bus_id[:32] or '(none)'}, "
            f"{IOMMU_GROUP}={attributes[IOMMU_GROUP].int if has_group else '(none)'}, "
            f"{VFIO_VIABLE}={viable}; select devices with "
            f"device.attributes[...].{VFIO_VIABLE} in the DeviceClass (docs/vfio.md)",
            claim_uid=claim_uid,
            device=device.name,
        )
    return PreparedVfio(
        device=device.name, pci_bus_id=bus_id, iommu_group=attributes[IOMMU_GROUP].int
    )


def claim_edits(
    *,
    backend: str,
    claim_uid: str,
    uses: Sequence[tuple[str, inventory_pb2.Device, str | None]],
    vfio: Sequence[PreparedVfio],
) -> ClaimEdits:
    """The CDI devices (one per (request, device, share ID) use, in order) and the spec-level
    `/dev/vfio/vfio`; raises `allowlist.ForbiddenEditError` for anything else."""
    host = allowlist.SIM_HOST if backend == "sim" else ""
    group_of = {v.device: v.iommu_group for v in vfio}
    by_request: dict[str, list[str]] = {}
    for request, device, _ in uses:
        names = by_request.setdefault(request, [])
        if device.name not in names:
            names.append(device.name)
    devices = []
    checked = []
    for request, device, share_id in uses:
        node = group_node(group_of[device.name])
        env = {DEVICES_ENV: ",".join(by_request[request]), CLAIM_UID_ENV: claim_uid}
        devices.append(
            spec_files.CDIDevice(
                name=spec_files.device_name(claim_uid, device.name, share_id),
                env=env,
                device_nodes=((node, host),),
            )
        )
        checked.append(
            allowlist.DeviceEdits(
                device=device.name,
                nodes=((node, host), (VFIO_CONTROL_NODE, host)),
                env=env,
                own=allowlist.Own(nodes=frozenset({node})),
                vfio=True,
            )
        )
    allowlist.check(backend=backend, claim_uid=claim_uid, devices=checked)
    return ClaimEdits(devices=devices, common_nodes=[(VFIO_CONTROL_NODE, host)])
