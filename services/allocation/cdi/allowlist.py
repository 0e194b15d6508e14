"""Which CDI container edits a node's backend may hand a container (pure).

The inventory arrives over the bus and is untrusted (docs/security.md): whatever
it says, a container gets only the device nodes and environment variables that the node's own
backend produces (docs/hardware.md §1.3, 3.5), under the host paths documented for them, and every
variable's value has the shape the driver writes. A device's edits are also bound to it
(`Own`): a numbered device node (`/dev/davinci<N>`, `/dev/nvidia<N>`, a MIG capability) or a
visible-devices value naming any other device is refused, and so is every vendor edit of a
kind the backend never makes. The MIG management capabilities (`nvidia-cap1`, `nvidia-cap2`)
are never handed out. Anything else fails the claim with `ForbiddenEditError`, naming each
device and edit; this module only decides (the preparer logs and counts). Hooks are never
produced, so none is allowed; a mount only from under the driver's own directories
(`check_spec`). Digits in patterns are ASCII only (`[0-9]`, `re.ASCII`).

A device prepared for a virtual machine (`DeviceEdits.vfio`, docs/vfio.md) gets its own rules
whatever the backend (`vfio_rules`): `/dev/vfio/vfio` and its own IOMMU group's
`/dev/vfio/<group>` (the container path as host path; the sim's `/dev/null`), the driver's own
variables, and nothing vendor-specific: no `/dev/nvidia*`, `/dev/davinci*`, no visible-devices
variable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from services.allocation.mps import layout as mps_layout
from shared.errors import ClaimError

__all__ = [
    "BACKENDS",
    "EDIT_KINDS",
    "VISIBLE_ENV",
    "BackendRules",
    "DeviceEdits",
    "ForbiddenEditError",
    "Own",
    "RejectedEdit",
    "check",
    "check_spec",
    "rules_for",
    "vfio_rules",
]

EDIT_KINDS = ("device_node", "host_path", "env_name", "env_value", "mount", "hook")
"""The `kind` label of `dra_prepare_rejected_edits_total`."""
_SHOWN = 96  # characters of a rejected edit quoted in errors and logs
_MAX_LISTED = 8  # rejected edits named in one claim's error

# The driver's own variables, on every backend (cdi.edits, claim.opaque, shares of a device).
_DRIVER_ENV = frozenset(
    {
        "DRA_SUITE_CLAIM_UID",
        "DRA_SUITE_DEVICES",
        "DRA_SUITE_PARTITION_ID",
        "DRA_SUITE_PARTITION_PROFILE",
        "DRA_SUITE_SHARING_STRATEGY",
        "DRA_SUITE_TIMESLICE_INTERVAL",
        "DRA_SUITE_COMPUTE_PERCENT",
        "DRA_SUITE_MEMORY_LIMIT",
    }
)
_CONSUMED_ENV = re.compile(r"DRA_SUITE_CONSUMED_[A-Z0-9_]{1,200}", re.ASCII)
_ASCEND_ENV = frozenset({"ASCEND_VISIBLE_DEVICES", "ASCEND_RUNTIME_OPTIONS"})
_NVIDIA_ENV = frozenset(
    {
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        mps_layout.PIPE_DIR_ENV,
        mps_layout.LOG_DIR_ENV,
    }
)
VISIBLE_ENV = frozenset({"ASCEND_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})
"""Variables that select devices: per device, only its own id (`Own.visible`)."""


def _listed(item: str) -> re.Pattern[str]:
    return re.compile(rf"{item}(,{item})*", re.ASCII)


_PERCENT = r"(100|[1-9][0-9]?)"
# A GPU or MIG device by index or UUID, never a runtime keyword (`all`, `none`, `void`).
_NVIDIA_ID = r"(?!(?i:all|none|void)(,|$))[A-Za-z0-9][A-Za-z0-9/_.:-]{0,127}"
# A Kubernetes quantity as the claim's allocation wrote it; empty for a device without it.
_QUANTITY = r"([0-9][0-9A-Za-z.+-]{0,63})?"
# Every variable's value has the shape the driver writes (edits, opaque, partitions).
_VALUES = {
    "ASCEND_VISIBLE_DEVICES": _listed(r"[0-9]{1,5}"),
    "ASCEND_RUNTIME_OPTIONS": re.compile(r"VIRTUAL"),
    "NVIDIA_VISIBLE_DEVICES": _listed(_NVIDIA_ID),
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": re.compile(_PERCENT),
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": _listed(r"[0-9]{1,3}=[0-9]{1,12}M"),
    # The claim's own MPS daemon's directories, as mounted into the container: only these.
    mps_layout.PIPE_DIR_ENV: re.compile(re.escape(mps_layout.CONTAINER_PIPE_DIR)),
    mps_layout.LOG_DIR_ENV: re.compile(re.escape(mps_layout.CONTAINER_LOG_DIR)),
    # A claim UID, or the device-plugin front's stand-in (`device-plugin <resource>`).
    "DRA_SUITE_CLAIM_UID": re.compile(r"[A-Za-z0-9][A-Za-z0-9 ./-]{0,255}", re.ASCII),
    "DRA_SUITE_DEVICES": _listed(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"),
    "DRA_SUITE_PARTITION_ID": _listed(r"[A-Za-z0-9][A-Za-z0-9/_.:-]{0,127}"),
    "DRA_SUITE_PARTITION_PROFILE": _listed(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}"),
    "DRA_SUITE_SHARING_STRATEGY": re.compile(r"Exclusive|TimeSlicing|SpacePartitioning"),
    "DRA_SUITE_TIMESLICE_INTERVAL": re.compile(r"Default|Short|Medium|Long"),
    "DRA_SUITE_COMPUTE_PERCENT": re.compile(_PERCENT),
    "DRA_SUITE_MEMORY_LIMIT": re.compile(r"[0-9]{1,20}"),
}
_CONSUMED_VALUE = _listed(_QUANTITY)
_ASCEND_NODES = re.compile(r"/dev/(davinci[0-9]{1,5}|davinci_manager|devmm_svm|hisi_hdc)", re.ASCII)
# Capabilities 1 and 2 are MIG `config` and `monitor` (management of every MIG device of the
# node): never a container's. A MIG device's own are its GI and CI access minors (`Own`).
_NVIDIA_NODES = re.compile(
    r"/dev/(nvidia[0-9]{1,5}|nvidiactl|nvidia-uvm|nvidia-uvm-tools"
    r"|nvidia-caps/nvidia-cap([3-9]|[1-9][0-9]{1,6}))",
    re.ASCII,
)
# Device nodes that name one device: they must be the device's own (`Own.nodes`).
_NUMBERED = re.compile(
    r"/dev/(davinci|nvidia)[0-9]+|/dev/nvidia-caps/nvidia-cap[0-9]+|/dev/vfio/[0-9]+", re.ASCII
)
# A VFIO device: the container (the VM's launcher) gets the VFIO control node and the group.
_VFIO_NODES = re.compile(r"/dev/vfio/(vfio|[0-9]{1,6})", re.ASCII)
_VNPU_HOST = re.compile(r"/dev/davinci([0-9]{1,5})", re.ASCII)
_MOUNT_OPTIONS = frozenset({"ro", "bind", "rbind", "nosuid", "nodev", "noexec", "rprivate"})
SIM_HOST = "/dev/null"


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendRules:
    """What one backend may put into a container."""

    nodes: tuple[re.Pattern[str], ...]
    """Container paths of device nodes (full match)."""
    env: frozenset[str]
    """Variable names besides the driver's own."""
    sim_host: bool = False
    """Every host path is the sim backend's own `/dev/null` (sim nodes are never real)."""

    def host_allowed(self, path: str, host: str) -> bool:
        if self.sim_host:
            return host == SIM_HOST
        if not host or host == path:
            return True
        # A static vNPU: host /dev/vdavinci<N> is the container's /dev/davinci<N> (docs/hardware.md
        # §3.5).
        match = _VNPU_HOST.fullmatch(path)
        return match is not None and host == f"/dev/vdavinci{match.group(1)}"

    def env_allowed(self, name: str) -> bool:
        return name in self.env or name in _DRIVER_ENV or bool(_CONSUMED_ENV.fullmatch(name))


_RULES = {
    "ascend": BackendRules(nodes=(_ASCEND_NODES,), env=_ASCEND_ENV),
    "nvml": BackendRules(nodes=(_NVIDIA_NODES,), env=_NVIDIA_ENV),
    # The sim backend imitates both vendors' node names and variables (shared/sim/profiles),
    # always backed by /dev/null on the host.
    "sim": BackendRules(
        nodes=(_ASCEND_NODES, _NVIDIA_NODES), env=_ASCEND_ENV | _NVIDIA_ENV, sim_host=True
    ),
}
BACKENDS = frozenset(_RULES)
"""Backends with an allowlist; any other name may only bring the driver's own variables."""
# An unknown backend name (a forged inventory) gets nothing but the driver's own variables.
_NOTHING = BackendRules(nodes=(), env=frozenset())


def rules_for(backend: str) -> BackendRules:
    return _RULES.get(backend, _NOTHING)


def vfio_rules(backend: str) -> BackendRules:
    """What a device prepared for a virtual machine may bring: only the VFIO nodes."""
    if backend not in _RULES:
        return _NOTHING
    return BackendRules(nodes=(_VFIO_NODES,), env=frozenset(), sim_host=backend == "sim")


@dataclass(frozen=True, slots=True, kw_only=True)
class Own:
    """What one allocated device (or the partition made of it) may name, from the device's
    own name and the backend's view of it, never from an inventory list of others."""

    nodes: frozenset[str] = frozenset()
    """Its numbered device nodes: `/dev/davinci<id>`, `/dev/nvidia<minor>`, its MIG caps."""
    visible: frozenset[str] = frozenset()
    """`NAME=value` of its visible-devices variables: one id each."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceEdits:
    """The edits one inventory device brings into a claim's spec."""

    device: str
    nodes: Sequence[tuple[str, str]]
    """(container path, host path; empty host path = same path)."""
    env: Mapping[str, str]
    own: Own | None = None
    """The device's own ids; None: a request's joined edits, whose devices were each bound."""
    vendor: bool = True
    """False: a kind the backend never makes, which gets no vendor edit at all."""
    mounts: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    vfio: bool = False
    """A device prepared for a virtual machine: checked by `vfio_rules` instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RejectedEdit:
    device: str
    kind: str
    """One of `EDIT_KINDS`."""
    edit: str
    """The edit as written, cut to a readable length."""

    def __str__(self) -> str:
        return f"device {self.device}: {self.kind.replace('_', ' ')} {self.edit}"


class ForbiddenEditError(ClaimError):
    """A claim whose spec would carry an edit its node's backend never produces."""

    def __init__(
        self, message: str, *, claim_uid: str, backend: str, rejected: Sequence[RejectedEdit]
    ) -> None:
        super().__init__(message, claim_uid=claim_uid)
        self.backend = backend
        self.rejected = tuple(rejected)


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def _value_pattern(name: str) -> re.Pattern[str] | None:
    if _CONSUMED_ENV.fullmatch(name):
        return _CONSUMED_VALUE
    return _VALUES.get(name)


def _rejected(backend: str, edits: DeviceEdits) -> Iterable[RejectedEdit]:
    device = edits.device[:_SHOWN]
    rules = vfio_rules(backend) if edits.vfio else rules_for(backend)
    rules = rules if edits.vendor else _NOTHING
    own = edits.own
    for path, host in edits.nodes:
        if not any(pattern.fullmatch(path) for pattern in rules.nodes):
            yield RejectedEdit(device=device, kind="device_node", edit=_shown(path))
        elif not rules.host_allowed(path, host):
            yield RejectedEdit(
                device=device, kind="host_path", edit=f"{_shown(host)} as {_shown(path)}"
            )
        elif own is not None and _NUMBERED.fullmatch(path) and path not in own.nodes:
            yield RejectedEdit(
                device=device, kind="device_node", edit=f"{_shown(path)} (not this device's)"
            )
    for name, value in edits.env.items():
        pattern = _value_pattern(name)
        if not rules.env_allowed(name):
            yield RejectedEdit(device=device, kind="env_name", edit=_shown(name))
        elif pattern is None or not pattern.fullmatch(value):
            yield RejectedEdit(device=device, kind="env_value", edit=_shown(f"{name}={value}"))
        elif own is not None and name in VISIBLE_ENV and f"{name}={value}" not in own.visible:
            yield RejectedEdit(
                device=device,
                kind="env_value",
                edit=f"{_shown(f'{name}={value}')} (not this device's)",
            )


def check(*, backend: str, claim_uid: str, devices: Sequence[DeviceEdits]) -> None:
    """Raise `ForbiddenEditError` when any device's edits are outside `backend`'s allowlist."""
    rejected = [edit for edits in devices for edit in _rejected(backend, edits)]
    if rejected:
        raise _error(backend=backend, claim_uid=claim_uid, rejected=rejected)


def _clean(path: object) -> PurePosixPath | None:
    """`path` as an absolute path without `.`, `..` or empty parts; None when it is not."""
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        return None
    parts = path.split("/")[1:]
    if any(part in ("", ".", "..") for part in parts):
        return None
    return PurePosixPath(path)


def mount_allowed(mount: Mapping[str, Any], roots: Sequence[PurePosixPath]) -> bool:
    """A bind mount from strictly under one of the driver's own directories `roots` (the MPS
    pipe directory, a device metadata file), to a clean absolute path, with plain options."""
    host, container = _clean(mount.get("hostPath")), _clean(mount.get("containerPath"))
    options = mount.get("options") or []
    return (
        host is not None
        and container is not None
        and set(mount) <= {"hostPath", "containerPath", "type", "options"}
        and mount.get("type", "bind") == "bind"
        and isinstance(options, list)
        and set(options) <= _MOUNT_OPTIONS
        and any(root in host.parents for root in roots)
    )


def check_spec(
    spec: Mapping[str, Any],
    *,
    claim_uid: str,
    backend: str,
    mount_roots: Sequence[PurePosixPath] = (),
) -> None:
    """Refuse hooks, any edit beyond env, device nodes and mounts, and every mount but those
    `mount_allowed` under the driver's own directories `mount_roots`, in a built spec."""
    rejected = []
    scopes = [("(all devices)", spec.get("containerEdits") or {})]
    scopes += [(str(d.get("name", "")), d.get("containerEdits") or {}) for d in spec["devices"]]
    for name, edits in scopes:
        for key in sorted(set(edits) - {"env", "deviceNodes", "mounts"}):
            kind = {"hooks": "hook"}.get(key, "mount")
            rejected.append(RejectedEdit(device=name[:_SHOWN], kind=kind, edit=_shown(key)))
        for mount in edits.get("mounts") or []:
            if not isinstance(mount, Mapping) or not mount_allowed(mount, mount_roots):
                shown = _shown(str(mount.get("hostPath") if isinstance(mount, Mapping) else mount))
                rejected.append(RejectedEdit(device=name[:_SHOWN], kind="mount", edit=shown))
    if rejected:
        raise _error(backend=backend, claim_uid=claim_uid, rejected=rejected)


def _error(*, backend: str, claim_uid: str, rejected: Sequence[RejectedEdit]) -> ForbiddenEditError:
    listed = "; ".join(str(edit) for edit in rejected[:_MAX_LISTED])
    more = f"; and {len(rejected) - _MAX_LISTED} more" if len(rejected) > _MAX_LISTED else ""
    return ForbiddenEditError(
        f"prepare claim {claim_uid}: refused edits the {backend[:32] or 'unknown'} backend "
        f"never makes: {listed}{more}",
        claim_uid=claim_uid,
        backend=backend,
        rejected=rejected,
    )
