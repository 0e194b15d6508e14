"""CDI container edits per backend for the devices of one claim (pure).

The node's own backend (`--backend`, never the inventory's) picks how a device reaches a
container (docs/hardware.md §1.3, 3.5). Each device's nodes and visible-devices variables come from
the device the claim got (its name, the partition made for it) and the backend's view of it,
never from an inventory value that names other devices (`allowlist.Own`).

Each backend's edits of one device are its vendor package's (`Vendor.edits`:
`shared/vendors/<package>/cdi.py`); this module joins them per request and per claim.

A kind the backend never makes gets no vendor edit at all. Whatever the inventory says, the
result passes `allowlist.check` for the backend (each device's own nodes, control nodes and env
first, bound to the device, so a refusal names the device that brought it; then every device's
final env) or the claim fails with `ForbiddenEditError`.

Per request, variables of its devices are joined (`ASCEND_VISIBLE_DEVICES=0,1`): a container
gets every device of the requests it references. A device's partition replaces its nodes and
overrides its env. Consumed capacity of shared devices (docs/contracts.md §4.4) becomes
`DRA_SUITE_CONSUMED_<NAME>` (one value per distinct device of the request, in
`DRA_SUITE_DEVICES` order, two shares of one device summed) and, for NVIDIA GPUs, the MPS
memory limit `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (the lower of the share and any opaque
`memoryLimit`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from services.allocation.cdi import allowlist, spec_files
from services.allocation.cdi.spec_files import CDIDevice
from services.allocation.claim import opaque
from shared import quantity
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors import registry
from shared.vendors.parts.cdi import BackendEdits, ContainerEdits, Node
from shared.vendors.parts.partitions import Partition

__all__ = [
    "BACKENDS",
    "CLAIM_UID_ENV",
    "CONSUMED_ENV_PREFIX",
    "DEVICES_ENV",
    "PARTITION_ID_ENV",
    "PARTITION_PROFILE_ENV",
    "ClaimEdits",
    "DeviceUse",
    "check_devices",
    "claim_edits",
    "consumed_env_name",
]

CLAIM_UID_ENV = "DRA_SUITE_CLAIM_UID"
DEVICES_ENV = "DRA_SUITE_DEVICES"
PARTITION_ID_ENV = "DRA_SUITE_PARTITION_ID"
PARTITION_PROFILE_ENV = "DRA_SUITE_PARTITION_PROFILE"
CONSUMED_ENV_PREFIX = "DRA_SUITE_CONSUMED_"
_NOT_ENV = re.compile(r"[^A-Z0-9]")
BACKENDS = frozenset(registry.NAMES)
"""The backends with container edits (the agent's `--backend` values)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceUse:
    """One allocation result with its inventory device (and the partition made for it)."""

    request: str
    device: inventory_pb2.Device
    share_id: str | None = None
    consumed: Mapping[str, str] = field(default_factory=dict)
    partition: Partition | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimEdits:
    """The CDI devices (one per use, in order) and the edits shared by the whole spec."""

    devices: list[CDIDevice]
    common_nodes: list[Node]


def consumed_env_name(capacity: str) -> str:
    """`memory` -> `DRA_SUITE_CONSUMED_MEMORY`; `example.com/slots` -> `..._EXAMPLE_COM_SLOTS`."""
    return CONSUMED_ENV_PREFIX + _NOT_ENV.sub("_", capacity.upper())


def _backend_edits(backend: str, claim_uid: str) -> BackendEdits:
    try:
        return registry.BACKENDS[backend].edits
    except KeyError:
        raise ClaimError(
            f"claim {claim_uid}: no container edits for backend {backend[:32]!r}",
            claim_uid=claim_uid,
        ) from None


def _device_edits(backend: str, use: DeviceUse, claim_uid: str) -> ContainerEdits:
    """The backend's edits for one device; a partition replaces its nodes, overrides its env."""
    partition = use.partition
    edits = _backend_edits(backend, claim_uid)(
        use.device, claim_uid=claim_uid, partitioned=partition is not None
    )
    if partition is None:
        return edits
    env = {
        **edits.env,
        **partition.env,
        PARTITION_ID_ENV: partition.id,
        PARTITION_PROFILE_ENV: partition.profile,
    }
    nodes = list(partition.device_nodes) or edits.nodes
    return ContainerEdits(
        env=env,
        nodes=nodes,
        common=edits.common,
        own=_partition_own(backend, edits.own, partition),
        vendor=edits.vendor,
    )


def _partition_own(backend: str, device: allowlist.Own, partition: Partition) -> allowlist.Own:
    """The partition made for the claim (by this agent's manager) names itself: its own nodes
    (the vendor's `EditRules.partition_nodes`) and its id; any other node must still be the
    device's own."""
    made = registry.BACKENDS[backend].edit_rules.partition_nodes(partition)
    visible = {
        f"{name}={value}"
        for name, value in partition.env.items()
        if name in allowlist.VISIBLE_ENV and value == partition.id
    }
    return allowlist.Own(nodes=device.nodes | made, visible=frozenset(visible))


@dataclass(slots=True)
class _Request:
    """What the devices of one request add up to."""

    env: dict[str, list[str]] = field(default_factory=dict)
    devices: list[inventory_pb2.Device] = field(default_factory=list)
    consumed: dict[str, dict[str, int | str]] = field(default_factory=dict)
    """Device name -> capacity name -> consumed amount (summed over shares when whole)."""

    def add(self, use: DeviceUse, edits: ContainerEdits) -> None:
        for key, value in edits.env.items():
            if value not in self.env.setdefault(key, []):
                self.env[key].append(value)
        if all(d.name != use.device.name for d in self.devices):
            self.devices.append(use.device)
        used = self.consumed.setdefault(use.device.name, {})
        for name, amount in sorted(use.consumed.items()):
            whole = quantity.whole(amount)
            before = used.get(name, 0)
            # Two shares of one device add up; a fractional amount is passed on as written.
            used[name] = before + whole if whole is not None and isinstance(before, int) else amount

    def shares_env(self, config: opaque.DeviceConfig | None) -> dict[str, str]:
        """`DRA_SUITE_CONSUMED_*` per capacity, and the MPS memory limit per NVIDIA GPU."""
        names = sorted({name for used in self.consumed.values() for name in used})
        env = {
            consumed_env_name(name): ",".join(
                str(self.consumed[d.name].get(name, "")) for d in self.devices
            )
            for name in names
        }
        gpus = [d for d in self.devices if opaque.is_nvidia_kind(d.kind)]
        limits = [self._memory_limit(d.name, config) for d in gpus]
        if "memory" in names and any(limit is not None for limit in limits):
            env[opaque.MPS_MEMORY_LIMIT_ENV] = ",".join(
                f"{i}={max(1, limit // 2**20)}M"
                for i, limit in enumerate(limits)
                if limit is not None
            )
        return env

    def _memory_limit(self, device: str, config: opaque.DeviceConfig | None) -> int | None:
        consumed = self.consumed[device].get("memory")
        configured = None if config is None else config.memory_limit_bytes
        found = [v for v in (consumed, configured) if isinstance(v, int)]
        return min(found) if found else None


def claim_edits(
    *,
    backend: str,
    claim_uid: str,
    uses: Sequence[DeviceUse],
    configs: Mapping[str, opaque.DeviceConfig],
) -> ClaimEdits:
    """The CDI devices of a claim (one per use) and the nodes shared by the whole spec."""
    requests: dict[str, _Request] = {}
    common: list[Node] = []
    per_use = [_device_edits(backend, use, claim_uid) for use in uses]
    for use, edits in zip(uses, per_use, strict=True):
        requests.setdefault(use.request, _Request()).add(use, edits)
        common.extend(node for node in edits.common if node not in common)
    _check_devices(backend=backend, claim_uid=claim_uid, uses=uses, per_use=per_use)
    request_env = {
        name: _request_env(request, configs.get(name)) for name, request in requests.items()
    }
    devices = [
        CDIDevice(
            name=spec_files.device_name(claim_uid, use.device.name, use.share_id),
            env={**request_env[use.request], CLAIM_UID_ENV: claim_uid},
            device_nodes=tuple(edits.nodes),
        )
        for use, edits in zip(uses, per_use, strict=True)
    ]
    allowlist.check(
        backend=backend,
        claim_uid=claim_uid,
        devices=[
            allowlist.DeviceEdits(device=use.device.name, nodes=(), env=device.env)
            for use, device in zip(uses, devices, strict=True)
        ],
    )
    return ClaimEdits(devices=devices, common_nodes=common)


def check_devices(
    *,
    backend: str,
    claim_uid: str,
    devices: Sequence[inventory_pb2.Device],
    partitioned: Collection[str],
) -> None:
    """The allowlist over the devices' own edits (those named in `partitioned` as the
    partition's parent), before any partition is made of them."""
    uses = [DeviceUse(request="", device=device) for device in devices]
    edits_of = _backend_edits(backend, claim_uid)
    per_use = [
        edits_of(device, claim_uid=claim_uid, partitioned=device.name in partitioned)
        for device in devices
    ]
    _check_devices(backend=backend, claim_uid=claim_uid, uses=uses, per_use=per_use)


def _check_devices(
    *, backend: str, claim_uid: str, uses: Sequence[DeviceUse], per_use: Sequence[ContainerEdits]
) -> None:
    """Each device's own edits (partition included) against the backend's allowlist."""
    allowlist.check(
        backend=backend,
        claim_uid=claim_uid,
        devices=[
            allowlist.DeviceEdits(
                device=use.device.name,
                nodes=[*edits.nodes, *edits.common],
                env=edits.env,
                own=edits.own,
                vendor=edits.vendor,
            )
            for use, edits in zip(uses, per_use, strict=True)
        ],
    )


def _request_env(request: _Request, config: opaque.DeviceConfig | None) -> dict[str, str]:
    env = {key: ",".join(values) for key, values in request.env.items()}
    env[DEVICES_ENV] = ",".join(d.name for d in request.devices)
    if config is not None:
        gpus = sum(1 for d in request.devices if opaque.is_nvidia_kind(d.kind))
        env.update(opaque.container_env(config, nvidia_devices=gpus))
    env.update(request.shares_env(config))
    return env
