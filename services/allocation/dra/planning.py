"""What preparing a claim means on this node, computed without side effects (pure).

`plan()` turns an allocated claim, the node's inventory and the claim's opaque configs into the
stored answer (`PreparedClaim`): devices, CDI IDs, the CDI spec and the configs in force. It may
run twice for one claim (a retry after a crash) and gives the same answer both times: the CDI
IDs depend on the claim alone. The container edits are the backend's (`cdi.edits`): the node's
own backend (`--backend`), never the one the inventory names.

A claim whose config asks for partitions, or that got an option made on demand (a MIG
placement flagged `createdOnDemand`), is planned twice: first without them (the record then
names the partitions to make and has no spec yet), then, once the partition manager has made
them, with them (`partitions`, by the allocated device's name), which yields the spec naming
each partition. An option's partition is named by the option (its profile, not a config's);
a config that also sets `partition.profile` for it fails the claim.

A result with admin access (KEP-5018, `adminAccess`) gets its device as it is: the device's
own edits, no partition made for it, no share of it taken (no MPS daemon, no consumed capacity,
no config of its request in force). An option made on demand (a partition that does not
exist yet) or a `partition.profile` for it fails the claim: admin access never makes one.

A claim whose configs say `passthrough: vfio` is prepared for a virtual machine
(`services.allocation.vfio.plan`, docs/vfio.md): the record names each device's PCI function
and IOMMU group (`vfio`), the spec hands only the VFIO nodes, and the device metadata that
tells the VM's launcher the PCI address is written whatever `--device-metadata` says
(`vfio_metadata_root`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

from services.allocation.cdi import allowlist, edits, spec_files
from services.allocation.cdi.edits import CLAIM_UID_ENV, DEVICES_ENV, DeviceUse, claim_edits
from services.allocation.claim import opaque
from services.allocation.claim.checkpoint import (
    ClaimState,
    PreparedClaim,
    PreparedDevice,
    PreparedPartition,
    PreparedVfio,
)
from services.allocation.claim.claims import AllocatedClaim, DeviceResult
from services.allocation.metadata import document
from services.allocation.mps import layout as mps_layout
from services.allocation.mps import limits as mps_limits
from services.allocation.vfio import plan as vfio_plan
from shared.errors import ClaimError, DeviceNotAllocatableError, InvalidOpaqueConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.partitions import OnDemandOption, Partition, on_demand_option

__all__ = ["CLAIM_UID_ENV", "DEVICES_ENV", "find_device", "plan"]


def plan(
    claim: AllocatedClaim,
    inventory: inventory_pb2.Inventory | None,
    *,
    driver: str,
    backend: str,
    partitions: Mapping[str, Partition] | None = None,
    metadata_root: PurePosixPath | None = None,
    mps_root: PurePosixPath | None = None,
    vfio_metadata_root: PurePosixPath | None = None,
) -> PreparedClaim:
    """What preparing `claim` means on this node; pure, raises the claim's error.

    `partitions` are the partitions made for the claim, by device name. When the configs ask
    for partitions that are not all there, the record has `cdi_spec=None` and lists them.
    `metadata_root`: where device metadata files live (`metadata.files`); None: none written.
    `mps_root`: where MPS daemons keep their directories (`mps.daemons`); None: no daemon, a
    shared GPU gets only the MPS variables.
    `vfio_metadata_root`: where a claim for a virtual machine gets its metadata files when
    `metadata_root` is None (the VM's launcher finds the PCI address there).
    """
    ref = claim.ref
    resolved = [
        (result, find_device(inventory, result.device, claim_uid=ref.uid, pool=result.pool))
        for result in claim.results
    ]
    requests = list(dict.fromkeys(result.request for result, _ in resolved))
    configs = opaque.resolve(claim.configs, requests, driver=driver, claim_uid=ref.uid)
    vfio = vfio_plan.targets(resolved, configs, claim_uid=ref.uid)
    if vfio and metadata_root is None:
        metadata_root = vfio_metadata_root
    made = partitions or {}
    wanted = _partitions_wanted(resolved, configs, made, claim_uid=ref.uid)
    configs = _without_admin_requests(configs, resolved)
    names = spec_files.device_names(
        ref.uid, [(r.request, r.device, r.share_id) for r, _ in resolved]
    )
    mps = mps_limits.plan(resolved, configs) if mps_root is not None else None
    spec = None
    bodies: dict[str, dict[str, Any]] = {}
    if resolved and all(p.partition_id for p in wanted):
        if metadata_root is not None:
            bodies = _metadata(claim, resolved, driver=driver)
        spec = _spec(
            claim,
            resolved,
            configs,
            made,
            names=names,
            driver=driver,
            backend=backend,
            metadata_root=metadata_root,
            mps_root=mps_root if mps is not None else None,
            vfio=vfio,
        )
    elif resolved:
        # No partition is made of a device whose own edits its backend would not make.
        edits.check_devices(
            backend=backend,
            claim_uid=ref.uid,
            devices=[device for _, device in resolved],
            partitioned={p.device for p in wanted},
        )
    return PreparedClaim(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        driver=driver,
        state=ClaimState.PREPARE_STARTED,
        devices=tuple(
            _prepared_device(result, name=name, driver=driver)
            for (result, _), name in zip(resolved, names, strict=True)
        ),
        cdi_spec=spec,
        device_configs={
            request: opaque.encode(config, driver=driver) for request, config in configs.items()
        },
        partitions=wanted,
        device_metadata=bodies,
        mps=mps,
        vfio=vfio,
    )


def _metadata(
    claim: AllocatedClaim,
    resolved: list[tuple[DeviceResult, inventory_pb2.Device]],
    *,
    driver: str,
) -> dict[str, dict[str, Any]]:
    """One DeviceMetadata document per base request, its devices in allocation order."""
    ref = claim.ref
    devices: dict[str, list[dict[str, Any]]] = {}
    request_refs: dict[str, str] = {}
    for result, device in resolved:
        document.check_names(
            claim_uid=ref.uid, request=result.request, pod_claim_name=claim.pod_claim_name
        )
        request_refs.setdefault(result.request, result.request_ref or result.request)
        entries = devices.setdefault(result.request, [])
        if all(e["name"] != device.name for e in entries):  # two shares of one device: once
            entries.append(document.device_entry(driver=driver, pool=result.pool, device=device))
    return {
        request: document.document(
            name=ref.name,
            namespace=ref.namespace,
            uid=ref.uid,
            pod_claim_name=claim.pod_claim_name,
            request=request_refs[request],
            devices=entries,
        )
        for request, entries in devices.items()
    }


def _with_metadata_mounts(
    claim: AllocatedClaim,
    devices: list[spec_files.CDIDevice],
    requests: Sequence[str],
    *,
    root: PurePosixPath,
    driver: str,
) -> list[spec_files.CDIDevice]:
    """The first CDI device of each request mounts the request's metadata file: a container
    referencing the request gets every device of it (the Go helper adds the mount once too)."""
    mounted: set[str] = set()
    out = []
    for device, request in zip(devices, requests, strict=True):
        if request not in mounted:
            mounted.add(request)
            host = document.host_path(root, claim_uid=claim.ref.uid, request=request)
            container = document.container_path(
                driver=driver,
                claim=claim.ref.name,
                pod_claim_name=claim.pod_claim_name,
                request=request,
            )
            device = replace(device, mounts=(*device.mounts, document.mount(host, container)))
        out.append(device)
    return out


def _with_mps(
    claim_uid: str,
    devices: list[spec_files.CDIDevice],
    resolved: list[tuple[DeviceResult, inventory_pb2.Device]],
    configs: Mapping[str, opaque.DeviceConfig],
    *,
    root: PurePosixPath,
    backend: str,
) -> list[spec_files.CDIDevice]:
    """Each CDI device of a GPU the claim's daemon serves gets the daemon's directories and the
    variables that name them (checked against the backend's allowlist like every other)."""
    out = []
    for device, (result, inventory_device) in zip(devices, resolved, strict=True):
        if mps_limits.served(result, inventory_device, configs.get(result.request)):
            env = {**device.env, **mps_layout.container_env()}
            allowlist.check(
                backend=backend,
                claim_uid=claim_uid,
                devices=[allowlist.DeviceEdits(device=inventory_device.name, nodes=(), env=env)],
            )
            mounts = (*device.mounts, *mps_layout.mounts(root, claim_uid))
            device = replace(device, env=env, mounts=mounts)
        out.append(device)
    return out


def _prepared_device(result: DeviceResult, *, name: str, driver: str) -> PreparedDevice:
    """The answer for one result; its CDI ID depends on the claim alone (never on partitions)."""
    return PreparedDevice(
        request_names=(result.request,),
        pool=result.pool,
        device=result.device,
        share_id=result.share_id,
        cdi_device_ids=(spec_files.device_id(driver, name),),
        admin_access=result.admin_access,
    )


def _spec(
    claim: AllocatedClaim,
    resolved: list[tuple[DeviceResult, inventory_pb2.Device]],
    configs: Mapping[str, opaque.DeviceConfig],
    partitions: Mapping[str, Partition],
    *,
    names: Sequence[str],
    driver: str,
    backend: str,
    metadata_root: PurePosixPath | None,
    mps_root: PurePosixPath | None,
    vfio: Sequence[PreparedVfio] = (),
) -> dict[str, object]:
    uid = claim.ref.uid
    uses = [
        DeviceUse(
            request=result.request,
            device=device,
            share_id=result.share_id,
            # Admin access takes no share and gets no partition: the device as it is.
            consumed={} if result.admin_access else result.consumed_capacity,
            partition=None if result.admin_access else partitions.get(device.name),
        )
        for result, device in resolved
    ]
    if vfio:
        edits = vfio_plan.claim_edits(
            backend=backend,
            claim_uid=uid,
            uses=[(result.request, device, result.share_id) for result, device in resolved],
            vfio=vfio,
        )
    else:
        edits = claim_edits(backend=backend, claim_uid=uid, uses=uses, configs=configs)
    # One CDI device per use, named as the kubelet's answer names it (`spec_files.device_names`).
    devices = [replace(d, name=n) for d, n in zip(edits.devices, names, strict=True)]
    roots: tuple[PurePosixPath, ...] = ()
    if metadata_root is not None:
        roots = (metadata_root,)
        requests = [result.request for result, _ in resolved]
        devices = _with_metadata_mounts(claim, devices, requests, root=metadata_root, driver=driver)
    if mps_root is not None:
        roots = (*roots, mps_root)
        devices = _with_mps(uid, devices, resolved, configs, root=mps_root, backend=backend)
    spec = spec_files.build_spec(driver=driver, devices=devices, common_nodes=edits.common_nodes)
    allowlist.check_spec(spec, claim_uid=uid, backend=backend, mount_roots=roots)
    if problems := spec_files.validate(spec):
        raise ClaimError(
            f"prepare claim {uid}: invalid CDI spec: {'; '.join(problems)}", claim_uid=uid
        )
    return spec


def _partitions_wanted(
    resolved: list[tuple[DeviceResult, inventory_pb2.Device]],
    configs: Mapping[str, opaque.DeviceConfig],
    made: Mapping[str, Partition],
    *,
    claim_uid: str,
) -> tuple[PreparedPartition, ...]:
    """One partition per device whose request's config names a profile (shares included), and
    one per option made on demand, of the option's profile; none for admin access."""
    wanted: dict[str, PreparedPartition] = {}
    for result, device in resolved:
        config = configs.get(result.request)
        configured = config.partition_profile if config is not None else None
        option = on_demand_option(device, claim_uid=claim_uid)
        if result.admin_access:
            _refuse_admin_partition(result, device, option, configured, claim_uid=claim_uid)
            continue
        if option is not None and configured is not None:
            raise InvalidOpaqueConfigError(
                f"prepare claim {claim_uid}: device {device.name} is a {option.profile} "
                f"partition made on demand; request {result.request} must not also set "
                f"partition.profile ({configured})",
                claim_uid=claim_uid,
                field="partition.profile",
            )
        partition = made.get(result.device)
        profile = option.profile if option is not None else configured
        if profile is None and partition is not None:
            # Made for an option that the inventory now shows as the MIG device it became.
            profile = partition.profile
        if profile is None or result.device in wanted:
            continue
        wanted[result.device] = PreparedPartition(
            device=result.device,
            profile=profile,
            partition_id=partition.id if partition is not None else "",
        )
    return tuple(wanted.values())


def _refuse_admin_partition(
    result: DeviceResult,
    device: inventory_pb2.Device,
    option: OnDemandOption | None,
    configured: str | None,
    *,
    claim_uid: str,
) -> None:
    """Admin access gets a device as it is: one that would need a partition made fails."""
    if option is not None:
        raise DeviceNotAllocatableError(
            f"prepare claim {claim_uid}: request {result.request} has admin access to "
            f"{device.name}, a {option.profile} partition of {option.parent} that is made only "
            "when a claim gets it, so it does not exist yet; admin access gets a device as it "
            "is and never makes (or removes) a partition: ask for an existing device instead",
            claim_uid=claim_uid,
            device=device.name,
        )
    if configured is not None:
        raise InvalidOpaqueConfigError(
            f"prepare claim {claim_uid}: request {result.request} has admin access to device "
            f"{device.name}, which it gets as it is: its config must not set "
            f"partition.profile ({configured}); admin access never makes a partition",
            claim_uid=claim_uid,
            field="partition.profile",
        )


def _without_admin_requests(
    configs: Mapping[str, opaque.DeviceConfig],
    resolved: Sequence[tuple[DeviceResult, inventory_pb2.Device]],
) -> dict[str, opaque.DeviceConfig]:
    """The configs of the requests that are not admin access (all of whose results have it):
    an admin request joins no sharing (no strategy, no MPS limits) and gets no partition."""
    admin = {r.request for r, _ in resolved if r.admin_access} - {
        r.request for r, _ in resolved if not r.admin_access
    }
    return {request: config for request, config in configs.items() if request not in admin}


def find_device(
    inventory: inventory_pb2.Inventory | None, name: str, *, claim_uid: str, pool: str
) -> inventory_pb2.Device:
    """The inventory device `name`; an unknown device fails the claim."""
    for device in inventory.devices if inventory is not None else ():
        if device.name == name:
            return device
    raise DeviceNotAllocatableError(
        f"prepare claim {claim_uid}: device {name} is not in the inventory of pool {pool}",
        claim_uid=claim_uid,
        device=name,
    )
