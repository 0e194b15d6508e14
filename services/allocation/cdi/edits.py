"""CDI container edits per backend for the devices of one claim (pure).

The inventory's `backend` picks how a device reaches a container (HARDWARE.md 1.3, 3.5):

- `ascend` (kind `npu`): `/dev/davinci<id>` per device; `/dev/davinci_manager`,
  `/dev/devmm_svm`, `/dev/hisi_hdc` once per spec (spec-level edits);
  `ASCEND_VISIBLE_DEVICES=<ids of the request>`. A vNPU (chip name `...vir...`) is
  `/dev/vdavinci<id>` on the host, seen as `/dev/davinci<id>`, with
  `ASCEND_RUNTIME_OPTIONS=VIRTUAL`.
- `nvml` (kinds `gpu`, `mig`): `/dev/nvidia<minor>` per device; `/dev/nvidiactl`,
  `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools` once per spec; `NVIDIA_VISIBLE_DEVICES=<UUIDs>`.
  A MIG device gets its parent's node plus its `/dev/nvidia-caps/*` nodes and
  `NVIDIA_VISIBLE_DEVICES=MIG-<uuid>`; a MIG placement that does not exist yet (no UUID, no
  partition made for the claim) fails the claim rather than hand out the whole GPU.
- `sim` and anything else: the device's own nodes and env from the inventory, as published
  (sim nodes map to /dev/null on the host, so no real control nodes are added).

Whatever the inventory says, the result passes `allowlist.check` for the backend (each
device's own nodes, control nodes and env first, so a refusal names the device that brought
it; then every device's final env) or the claim fails with `ForbiddenEditError`.

Per request, variables of its devices are joined (`ASCEND_VISIBLE_DEVICES=0,1`): a container
gets every device of the requests it references. A device's partition replaces its nodes and
overrides its env. Consumed capacity of shared devices (CONTRACTS 4.4) becomes
`DRA_SUITE_CONSUMED_<NAME>` (one value per distinct device of the request, in
`DRA_SUITE_DEVICES` order, two shares of one device summed) and, for NVIDIA GPUs, the MPS
memory limit `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (the lower of the share and any opaque
`memoryLimit`). Ascend has no runtime-enforced memory limit variable (HARDWARE.md 3.5 names
none), so only our variable carries it there.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.allocation.cdi import allowlist, spec_files
from services.allocation.cdi.spec_files import CDIDevice
from services.allocation.dra import opaque
from services.allocation.partitions import Partition
from shared import quantity
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = [
    "ASCEND_CONTROL_NODES",
    "CLAIM_UID_ENV",
    "CONSUMED_ENV_PREFIX",
    "DEVICES_ENV",
    "NVIDIA_CONTROL_NODES",
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
ASCEND_CONTROL_NODES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_NVIDIA_NODE = re.compile(r"^/dev/nvidia(\d+)$")
_NPU_NAME = re.compile(r"-(\d+)$")
_VNPU_CHIP = re.compile(r"vir\d+")
_NOT_ENV = re.compile(r"[^A-Z0-9]")
_CAPS_DIR = "/dev/nvidia-caps/"

Node = tuple[str, str]


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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Edits:
    env: dict[str, str]
    nodes: list[Node]
    common: list[Node] = field(default_factory=list)


def consumed_env_name(capacity: str) -> str:
    """`memory` -> `DRA_SUITE_CONSUMED_MEMORY`; `example.com/slots` -> `..._EXAMPLE_COM_SLOTS`."""
    return CONSUMED_ENV_PREFIX + _NOT_ENV.sub("_", capacity.upper())


def _hosts(device: inventory_pb2.Device) -> dict[str, str]:
    return {node.path: node.host_path for node in device.device_nodes}


def _sim(device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool) -> _Edits:
    return _Edits(env=dict(device.env), nodes=[(n.path, n.host_path) for n in device.device_nodes])


def _ascend(device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool) -> _Edits:
    if device.kind != "npu":
        return _sim(device, claim_uid=claim_uid, partitioned=partitioned)
    attributes = device.attributes
    match = _NPU_NAME.search(device.name)
    if "index" in attributes:
        device_id = str(attributes["index"].int)
    elif match is not None:
        device_id = match.group(1)
    else:
        raise ClaimError(
            f"claim {claim_uid}: npu {device.name} has no device id", claim_uid=claim_uid
        )
    hosts = _hosts(device)
    path = f"/dev/davinci{device_id}"
    host = hosts.get(path, "")
    env = {"ASCEND_VISIBLE_DEVICES": device_id}
    chip = attributes["chipName"].string if "chipName" in attributes else ""
    if _VNPU_CHIP.search(chip):
        host = host or f"/dev/vdavinci{device_id}"
        env["ASCEND_RUNTIME_OPTIONS"] = "VIRTUAL"
    common = [(p, hosts.get(p, "")) for p in ASCEND_CONTROL_NODES]
    return _Edits(env=env, nodes=[(path, host)], common=common)


def _nvidia_node(device: inventory_pb2.Device, claim_uid: str) -> Node:
    """`/dev/nvidia<minor>` of the GPU (of the parent GPU, for a MIG device)."""
    hosts = _hosts(device)
    for node in device.device_nodes:
        if _NVIDIA_NODE.match(node.path):
            return node.path, node.host_path
    if "index" in device.attributes:
        path = f"/dev/nvidia{device.attributes['index'].int}"
        return path, hosts.get(path, "")
    raise ClaimError(
        f"claim {claim_uid}: gpu {device.name} has no /dev/nvidiaN node", claim_uid=claim_uid
    )


def _nvidia(device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool) -> _Edits:
    if device.kind not in ("gpu", "mig"):
        return _sim(device, claim_uid=claim_uid, partitioned=partitioned)
    hosts = _hosts(device)
    common = [(p, hosts.get(p, "")) for p in NVIDIA_CONTROL_NODES]
    node = _nvidia_node(device, claim_uid)
    uuid = device.uuid or (device.attributes["uuid"].string if "uuid" in device.attributes else "")
    if device.kind == "gpu":
        visible = uuid or node[0].removeprefix("/dev/nvidia")
        return _Edits(env={"NVIDIA_VISIBLE_DEVICES": visible}, nodes=[node], common=common)
    caps = [(n.path, n.host_path) for n in device.device_nodes if n.path.startswith(_CAPS_DIR)]
    if partitioned:
        return _Edits(env={}, nodes=[node, *caps], common=common)
    if not uuid:
        raise ClaimError(
            f"claim {claim_uid}: MIG device {device.name} does not exist yet (no UUID) and no "
            "partition was made for it; making MIG devices at prepare time is not implemented "
            "for the nvml backend",
            claim_uid=claim_uid,
        )
    visible = uuid if uuid.startswith("MIG-") else f"MIG-{uuid}"
    return _Edits(env={"NVIDIA_VISIBLE_DEVICES": visible}, nodes=[node, *caps], common=common)


class _BackendEdits(Protocol):
    def __call__(
        self, device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool
    ) -> _Edits: ...


_BACKENDS: dict[str, _BackendEdits] = {"ascend": _ascend, "nvml": _nvidia}


def _device_edits(backend: str, use: DeviceUse, claim_uid: str) -> _Edits:
    """The backend's edits for one device; a partition replaces its nodes, overrides its env."""
    partition = use.partition
    edits = _BACKENDS.get(backend, _sim)(
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
    return _Edits(env=env, nodes=nodes, common=edits.common)


@dataclass(slots=True)
class _Request:
    """What the devices of one request add up to."""

    env: dict[str, list[str]] = field(default_factory=dict)
    devices: list[inventory_pb2.Device] = field(default_factory=list)
    consumed: dict[str, dict[str, int | str]] = field(default_factory=dict)
    """Device name -> capacity name -> consumed amount (summed over shares when whole)."""

    def add(self, use: DeviceUse, edits: _Edits) -> None:
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
    per_use = [
        _BACKENDS.get(backend, _sim)(
            device, claim_uid=claim_uid, partitioned=device.name in partitioned
        )
        for device in devices
    ]
    _check_devices(backend=backend, claim_uid=claim_uid, uses=uses, per_use=per_use)


def _check_devices(
    *, backend: str, claim_uid: str, uses: Sequence[DeviceUse], per_use: Sequence[_Edits]
) -> None:
    """Each device's own edits (partition included) against the backend's allowlist."""
    allowlist.check(
        backend=backend,
        claim_uid=claim_uid,
        devices=[
            allowlist.DeviceEdits(
                device=use.device.name, nodes=[*edits.nodes, *edits.common], env=edits.env
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
