"""CDI container edits per backend for the devices of one claim (pure).

The node's own backend (`--backend`, never the inventory's) picks how a device reaches a
container (docs/hardware.md §1.3, 3.5). Each device's nodes and visible-devices variables come from
the device the claim got (its name, the partition made for it) and the backend's view of it,
never from an inventory value that names other devices (`allowlist.Own`):

- `ascend` (kind `npu`): `/dev/davinci<id>` per device, `<id>` from the device's name
  (`npu-<id>`, as discovery names it; an `index` attribute is not read); `/dev/davinci_manager`,
  `/dev/devmm_svm`, `/dev/hisi_hdc` once per spec (spec-level edits);
  `ASCEND_VISIBLE_DEVICES=<ids of the request>`. A vNPU (chip name `...vir...`) is
  `/dev/vdavinci<id>` on the host, seen as `/dev/davinci<id>`, with
  `ASCEND_RUNTIME_OPTIONS=VIRTUAL`.
- `nvml` (kinds `gpu`, `mig`): `/dev/nvidia<minor>` per device (its one numbered node; a
  device listing two fails); `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools` once
  per spec; `NVIDIA_VISIBLE_DEVICES=<UUIDs>` (one `GPU-` UUID per device). A MIG device gets
  its parent's node plus the GI and CI access capabilities of its own instance (of the
  parent's minor, numbered as `/proc/driver/nvidia-caps/mig-minors` numbers them, see
  `shared.vendors.nvidia.naming`; a partition's are the ones read when it was made) and
  `NVIDIA_VISIBLE_DEVICES=MIG-<uuid>`. A MIG device that exists is published with its UUID and
  capability nodes; an option made on demand (`createdOnDemand`) gets the partition made for
  it at prepare; a MIG device with neither (no UUID, no partition made for the claim) fails
  the claim rather than hand out the whole GPU.
- `sim` (kinds `npu`, `gpu`, `mig`): the device's nodes and env from the inventory, as
  published (sim nodes map to /dev/null on the host, so no real control nodes are added), each
  numbered node and visible id bound to the device's own number (`npu-<n>`, `gpu-<n>`, a MIG
  device's parent's).

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
`memoryLimit`). Ascend has no runtime-enforced memory limit variable (docs/hardware.md §3.5 names
none), so only our variable carries it there.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.allocation.cdi import allowlist, spec_files
from services.allocation.cdi.spec_files import CDIDevice
from services.allocation.claim import opaque
from services.allocation.partitions import ON_DEMAND, Partition
from shared import quantity
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import naming

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
_NVIDIA_NODE = re.compile(r"/dev/nvidia([0-9]{1,5})", re.ASCII)
_CAP_NODE = re.compile(r"/dev/nvidia-caps/nvidia-cap([0-9]{1,7})", re.ASCII)
_NUMBER = re.compile(r".*-([0-9]{1,5})", re.ASCII | re.DOTALL)
_VNPU_CHIP = re.compile(r"vir[0-9]+", re.ASCII)
_GPU_UUID = re.compile(r"GPU-[0-9A-Fa-f-]{1,64}", re.ASCII)
_MIG_UUID = re.compile(r"MIG-[0-9A-Za-z/-]{1,96}", re.ASCII)
_NOT_ENV = re.compile(r"[^A-Z0-9]")
_CAPS_DIR = naming.CAPS_DIR
_ASCEND_KINDS = frozenset({"npu"})
_NVIDIA_KINDS = frozenset({"gpu", "mig"})
_SIM_KINDS = _ASCEND_KINDS | _NVIDIA_KINDS

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
    own: allowlist.Own = field(default_factory=allowlist.Own)
    """What the device may name (its own numbered nodes and visible ids)."""
    vendor: bool = True
    """False: a kind the backend never makes (no vendor edit passes)."""


def consumed_env_name(capacity: str) -> str:
    """`memory` -> `DRA_SUITE_CONSUMED_MEMORY`; `example.com/slots` -> `..._EXAMPLE_COM_SLOTS`."""
    return CONSUMED_ENV_PREFIX + _NOT_ENV.sub("_", capacity.upper())


def _hosts(device: inventory_pb2.Device) -> dict[str, str]:
    return {node.path: node.host_path for node in device.device_nodes}


def _number(name: str) -> str | None:
    """The device's number in its name: `npu-3` -> `3`; None without one."""
    match = _NUMBER.fullmatch(name)
    return str(int(match.group(1))) if match is not None else None


def _made_on_demand(device: inventory_pb2.Device) -> bool:
    flag = device.attributes.get(ON_DEMAND)
    return flag is not None and flag.bool


def _visible(name: str, *values: str) -> frozenset[str]:
    return frozenset(f"{name}={value}" for value in values)


def _foreign(device: inventory_pb2.Device) -> _Edits:
    """A kind the backend never makes: its edits as published, none of which may be a vendor's."""
    nodes = [(n.path, n.host_path) for n in device.device_nodes]
    return _Edits(env=dict(device.env), nodes=nodes, vendor=False)


def _sim(device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool) -> _Edits:
    if device.kind not in _SIM_KINDS:
        return _foreign(device)
    number = _number(device.parent if device.kind == "mig" else device.name)
    own = allowlist.Own()
    if number is not None and device.kind in _ASCEND_KINDS:
        own = allowlist.Own(
            nodes=frozenset({f"/dev/davinci{number}"}),
            visible=_visible("ASCEND_VISIBLE_DEVICES", number),
        )
    elif number is not None:
        uuid = device.uuid if _GPU_UUID.fullmatch(device.uuid) else number
        own = allowlist.Own(
            nodes=frozenset({f"/dev/nvidia{number}"}),
            visible=_visible("NVIDIA_VISIBLE_DEVICES", number, uuid)
            if device.kind == "gpu"
            else frozenset(),
        )
    nodes = [(n.path, n.host_path) for n in device.device_nodes]
    return _Edits(env=dict(device.env), nodes=nodes, own=own)


def _ascend(device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool) -> _Edits:
    if device.kind not in _ASCEND_KINDS:
        return _foreign(device)
    # The name the claim was allocated, as discovery names the chip; never an attribute. A
    # vNPU template option is no device yet: its chip's nodes, which its vNPU's replace.
    if _made_on_demand(device) and not (partitioned and device.parent):
        raise ClaimError(
            f"claim {claim_uid}: vNPU {device.name} is made at prepare (createdOnDemand) and "
            "no partition was made for it",
            claim_uid=claim_uid,
        )
    device_id = _number(device.parent if _made_on_demand(device) else device.name)
    if device_id is None:
        raise ClaimError(
            f"claim {claim_uid}: npu {device.name} has no device id", claim_uid=claim_uid
        )
    hosts = _hosts(device)
    path = f"/dev/davinci{device_id}"
    host = hosts.get(path, "")
    env = {"ASCEND_VISIBLE_DEVICES": device_id}
    attributes = device.attributes
    chip = attributes["chipName"].string if "chipName" in attributes else ""
    if _VNPU_CHIP.search(chip):
        host = host or f"/dev/vdavinci{device_id}"
        env["ASCEND_RUNTIME_OPTIONS"] = "VIRTUAL"
    common = [(p, hosts.get(p, "")) for p in ASCEND_CONTROL_NODES]
    own = allowlist.Own(
        nodes=frozenset({path}), visible=_visible("ASCEND_VISIBLE_DEVICES", device_id)
    )
    return _Edits(env=env, nodes=[(path, host)], common=common, own=own)


def _nvidia_nodes(device: inventory_pb2.Device, claim_uid: str) -> list[Node]:
    """`/dev/nvidia<minor>` of the GPU (of the parent GPU, for a MIG device), first; any other
    numbered node the device lists follows, for the allowlist to refuse."""
    numbered = [
        (n.path, n.host_path) for n in device.device_nodes if _NVIDIA_NODE.fullmatch(n.path)
    ]
    if numbered:
        return numbered
    if "index" in device.attributes:
        path = f"/dev/nvidia{device.attributes['index'].int}"
        return [(path, _hosts(device).get(path, ""))]
    raise ClaimError(
        f"claim {claim_uid}: gpu {device.name} has no /dev/nvidiaN node", claim_uid=claim_uid
    )


def _mig_caps(device: inventory_pb2.Device, minor: int) -> tuple[list[Node], frozenset[str]]:
    """The MIG device's capability nodes as published, and those of them that are its own
    instance's: one GI access of the parent GPU `minor`, and at most one CI access of that GI."""
    caps = [(n.path, n.host_path) for n in device.device_nodes if n.path.startswith(_CAPS_DIR)]
    minors = sorted(int(m.group(1)) for p, _ in caps if (m := _CAP_NODE.fullmatch(p)))
    if len(minors) != len(caps) or not 1 <= len(minors) <= 2:
        return caps, frozenset()
    gi, cis = minors[0], minors[1:]
    # `mig-minors` numbering (`naming`): the GI access caps of GPU `minor`, each followed by
    # the access caps of its CIs.
    own_gi = any(
        gi == naming.gpu_instance_cap(minor, instance)
        for instance in range(naming.GPU_INSTANCES_PER_GPU)
    )
    if not own_gi or not all(gi < ci < gi + naming.CAPS_PER_GPU_INSTANCE for ci in cis):
        return caps, frozenset()
    return caps, frozenset(path for path, _ in caps)


def _nvidia(device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool) -> _Edits:
    if device.kind not in _NVIDIA_KINDS:
        return _foreign(device)
    hosts = _hosts(device)
    common = [(p, hosts.get(p, "")) for p in NVIDIA_CONTROL_NODES]
    nodes = _nvidia_nodes(device, claim_uid)
    node = nodes[0]
    minor = node[0].removeprefix("/dev/nvidia")
    uuid = device.uuid or (device.attributes["uuid"].string if "uuid" in device.attributes else "")
    if device.kind == "gpu":
        visible = uuid or minor
        own = allowlist.Own(
            nodes=frozenset({node[0]}),
            visible=_visible("NVIDIA_VISIBLE_DEVICES", visible)
            if _GPU_UUID.fullmatch(visible) or visible == minor
            else frozenset(),
        )
        return _Edits(env={"NVIDIA_VISIBLE_DEVICES": visible}, nodes=nodes, common=common, own=own)
    if partitioned:
        # The partition brings the capabilities of the instance made for the claim.
        return _Edits(
            env={}, nodes=nodes, common=common, own=allowlist.Own(nodes=frozenset({node[0]}))
        )
    if not uuid:
        raise ClaimError(
            f"claim {claim_uid}: MIG device {device.name} does not exist yet (no UUID) and no "
            "partition was made for it: the inventory publishes it neither as an existing MIG "
            "device nor as an option made on demand (createdOnDemand)",
            claim_uid=claim_uid,
        )
    visible = naming.mig_uuid(uuid)
    caps, own_caps = _mig_caps(device, int(minor))
    own = allowlist.Own(
        nodes=frozenset({node[0]}) | own_caps,
        visible=_visible("NVIDIA_VISIBLE_DEVICES", visible)
        if _MIG_UUID.fullmatch(visible)
        else frozenset(),
    )
    return _Edits(
        env={"NVIDIA_VISIBLE_DEVICES": visible}, nodes=[*nodes, *caps], common=common, own=own
    )


class _BackendEdits(Protocol):
    def __call__(
        self, device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool
    ) -> _Edits: ...


_BACKENDS: dict[str, _BackendEdits] = {"ascend": _ascend, "nvml": _nvidia, "sim": _sim}
BACKENDS = frozenset(_BACKENDS)
"""The backends with container edits (the agent's `--backend` values)."""


def _backend_edits(backend: str, claim_uid: str) -> _BackendEdits:
    try:
        return _BACKENDS[backend]
    except KeyError:
        raise ClaimError(
            f"claim {claim_uid}: no container edits for backend {backend[:32]!r}",
            claim_uid=claim_uid,
        ) from None


def _device_edits(backend: str, use: DeviceUse, claim_uid: str) -> _Edits:
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
    return _Edits(
        env=env,
        nodes=nodes,
        common=edits.common,
        own=_partition_own(edits.own, partition),
        vendor=edits.vendor,
    )


def _partition_own(device: allowlist.Own, partition: Partition) -> allowlist.Own:
    """The partition made for the claim (by this agent's manager) names itself: its MIG
    capabilities, its vNPU node and its id; any other node must still be the device's own."""
    made = {path for path, _ in partition.device_nodes if path.startswith(_CAPS_DIR)}
    if partition.id.isascii() and partition.id.isdigit():
        made.add(f"/dev/davinci{partition.id}")  # a vNPU
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
    edits_of = _backend_edits(backend, claim_uid)
    per_use = [
        edits_of(device, claim_uid=claim_uid, partitioned=device.name in partitioned)
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
