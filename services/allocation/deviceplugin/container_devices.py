"""What a container gets on the device-plugin front, and the static CDI spec behind it (pure).

Edits come from `cdi.edits.claim_edits`, the same per-backend rules and allowlist as a DRA
prepare (`cdi.allowlist`): whatever an inventory says, a container gets only the device nodes
and variables its node's backend produces. A device whose edits the allowlist refuses is left
out of the static spec and fails any Allocate naming it (`ForbiddenEditError`).

One static spec per driver (`k8s.<driver>-device.json`, kind `k8s.<driver>/device`) names
every offered device by its ID with its own device nodes; the nodes every device needs go into
the spec-level edits. Variables are per container (`ASCEND_VISIBLE_DEVICES=0,1` for two
NPUs), so they are in the Allocate answer, not in the spec, where two devices' values would
overwrite each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.allocation.cdi import allowlist, spec_files
from services.allocation.cdi.edits import CLAIM_UID_ENV, DeviceUse, claim_edits
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = [
    "CDI_CLASS",
    "ContainerAllocation",
    "cdi_device_id",
    "container_allocation",
    "spec_file_name",
    "static_spec",
]

CDI_CLASS = "device"
_REQUEST = "container"
_PERMISSIONS = "rw"


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerAllocation:
    """The answer for one container: env, device nodes (container, host) and CDI devices."""

    envs: dict[str, str]
    device_nodes: list[tuple[str, str]]
    cdi_devices: list[str]
    permissions: str = _PERMISSIONS


def spec_file_name(driver: str) -> str:
    return f"{spec_files.vendor(driver)}-{CDI_CLASS}.json"


def cdi_device_id(driver: str, device_id: str) -> str:
    """`k8s.<driver>/device=<device ID>`: what the runtime resolves against the static spec."""
    return f"{spec_files.vendor(driver)}/{CDI_CLASS}={device_id}"


def _label(resource: str) -> str:
    """Stands in for a claim UID in the shared edit code: errors name the resource."""
    return f"device-plugin {resource}"


def container_allocation(
    devices: Sequence[inventory_pb2.Device], *, backend: str, driver: str, resource: str
) -> ContainerAllocation:
    """The edits of one container's devices; `ForbiddenEditError`/`ClaimError` when refused."""
    uses = [DeviceUse(request=_REQUEST, device=device) for device in devices]
    edits = claim_edits(backend=backend, claim_uid=_label(resource), uses=uses, configs={})
    envs = {k: v for k, v in edits.devices[0].env.items() if k != CLAIM_UID_ENV} if uses else {}
    nodes: list[tuple[str, str]] = []
    for node in [*(n for d in edits.devices for n in d.device_nodes), *edits.common_nodes]:
        path, host = node
        if all(path != known for known, _ in nodes):
            nodes.append((path, host or path))
    return ContainerAllocation(
        envs=envs,
        device_nodes=nodes,
        cdi_devices=[cdi_device_id(driver, device.name) for device in devices],
    )


def static_spec(
    devices: Sequence[inventory_pb2.Device], *, backend: str, driver: str
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The spec naming every device the allowlist accepts, and why each other one was refused.

    None when no device is left.
    """
    accepted: list[spec_files.CDIDevice] = []
    common: list[tuple[str, str]] = []
    refused: dict[str, str] = {}
    for device in devices:
        uses = [DeviceUse(request=_REQUEST, device=device)]
        try:
            edits = claim_edits(
                backend=backend, claim_uid=_label(device.name), uses=uses, configs={}
            )
        except ClaimError as exc:
            refused[device.name] = str(exc)
            continue
        (built,) = edits.devices
        accepted.append(
            spec_files.CDIDevice(name=device.name, env={}, device_nodes=built.device_nodes)
        )
        common.extend(node for node in edits.common_nodes if node not in common)
    if not accepted:
        return None, refused
    spec = spec_files.build_spec(driver=driver, devices=accepted, common_nodes=common)
    spec["kind"] = f"{spec_files.vendor(driver)}/{CDI_CLASS}"
    spec["cdiVersion"] = spec_files.required_version(spec)
    allowlist.check_spec(spec, claim_uid=_label(driver), backend=backend)
    if problems := spec_files.validate(spec):
        raise ClaimError(f"device-plugin CDI spec: {'; '.join(problems)}", claim_uid="")
    return spec, refused
