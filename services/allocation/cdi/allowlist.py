"""Which CDI container edits a node's backend may hand a container (pure).

The inventory arrives over the bus and is untrusted (docs/security.md): whatever
it says, a container gets only the device nodes and environment variables that the node's own
backend produces (docs/hardware.md §1.3, 3.5), under the host paths documented for them, and every
variable's value has the shape the driver writes. Each backend's rules are its vendor
package's (`Vendor.edit_rules`), with the driver's own variables added here. A device's
edits are also bound to it (`Own`): a numbered device node (`/dev/davinci<N>`,
`/dev/nvidia<N>`, a MIG capability) or a visible-devices value naming any other device is
refused, and so is every vendor edit of a
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
from shared.vendors import registry
from shared.vendors.parts.cdi import EditRules, Own

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


def _listed(item: str) -> re.Pattern[str]:
    return re.compile(rf"{item}(,{item})*", re.ASCII)


_PERCENT = r"(100|[1-9][0-9]?)"
# The driver's own variables, on every backend (cdi.edits, claim.opaque, shares of a device),
# each with the shape of value the driver writes.
_DRIVER_ENV = {
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
_CONSUMED_ENV = re.compile(r"DRA_SUITE_CONSUMED_[A-Z0-9_]{1,200}", re.ASCII)
# A Kubernetes quantity as the claim's allocation wrote it; empty for a device without it.
_CONSUMED_VALUE = _listed(r"([0-9][0-9A-Za-z.+-]{0,63})?")
# The claim's own MPS daemon's directories, as mounted into the container: only these.
_MPS_ENV = {
    mps_layout.PIPE_DIR_ENV: re.compile(re.escape(mps_layout.CONTAINER_PIPE_DIR)),
    mps_layout.LOG_DIR_ENV: re.compile(re.escape(mps_layout.CONTAINER_LOG_DIR)),
}
# A VFIO device: the container (the VM's launcher) gets the VFIO control node and the group.
_VFIO_NODES = re.compile(r"/dev/vfio/(vfio|[0-9]{1,6})", re.ASCII)
_VFIO_NUMBERED = re.compile(r"/dev/vfio/[0-9]+", re.ASCII)
_MOUNT_OPTIONS = frozenset({"ro", "bind", "rbind", "nosuid", "nodev", "noexec", "rprivate"})
SIM_HOST = "/dev/null"


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendRules:
    """What one backend may put into a container (its vendor's `EditRules`, and the driver's
    own variables)."""

    nodes: tuple[re.Pattern[str], ...]
    """Container paths of device nodes (full match)."""
    env: Mapping[str, re.Pattern[str]]
    """Variables besides the driver's own, and the shape of each one's value."""
    visible: frozenset[str] = frozenset()
    """Variables that select devices: per device, only its own id (`Own.visible`)."""
    numbered: tuple[re.Pattern[str], ...] = ()
    """Device nodes that name one device: they must be the device's own (`Own.nodes`)."""
    host_aliases: tuple[tuple[re.Pattern[str], str], ...] = ()
    sim_host: bool = False
    """Every host path is the sim backend's own `/dev/null` (sim nodes are never real)."""

    def host_allowed(self, path: str, host: str) -> bool:
        if self.sim_host:
            return host == SIM_HOST
        if not host or host == path:
            return True
        return any(
            (match := pattern.fullmatch(path)) is not None and host == match.expand(template)
            for pattern, template in self.host_aliases
        )

    def env_allowed(self, name: str) -> bool:
        return name in self.env or name in _DRIVER_ENV or bool(_CONSUMED_ENV.fullmatch(name))

    def value_pattern(self, name: str) -> re.Pattern[str] | None:
        if _CONSUMED_ENV.fullmatch(name):
            return _CONSUMED_VALUE
        return _DRIVER_ENV.get(name) or self.env.get(name)


def _backend_rules(rules: EditRules) -> BackendRules:
    return BackendRules(
        nodes=rules.nodes,
        env={**rules.env, **(_MPS_ENV if rules.mps else {})},
        visible=rules.visible,
        numbered=rules.numbered,
        host_aliases=rules.host_aliases,
        sim_host=rules.sim_host,
    )


_RULES = {name: _backend_rules(vendor.edit_rules) for name, vendor in registry.BACKENDS.items()}
BACKENDS = frozenset(_RULES)
"""Backends with an allowlist; any other name may only bring the driver's own variables."""
VISIBLE_ENV = frozenset(name for rules in _RULES.values() for name in rules.visible)
"""Variables that select devices, on any backend: per device, only its own id."""
# An unknown backend name (a forged inventory) gets nothing but the driver's own variables.
_NOTHING = BackendRules(nodes=(), env={})


def rules_for(backend: str) -> BackendRules:
    return _RULES.get(backend, _NOTHING)


def vfio_rules(backend: str) -> BackendRules:
    """What a device prepared for a virtual machine may bring: only the VFIO nodes."""
    rules = _RULES.get(backend)
    if rules is None:
        return _NOTHING
    return BackendRules(
        nodes=(_VFIO_NODES,), env={}, numbered=(_VFIO_NUMBERED,), sim_host=rules.sim_host
    )


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
        elif (
            own is not None
            and any(pattern.fullmatch(path) for pattern in rules.numbered)
            and path not in own.nodes
        ):
            yield RejectedEdit(
                device=device, kind="device_node", edit=f"{_shown(path)} (not this device's)"
            )
    for name, value in edits.env.items():
        pattern = rules.value_pattern(name)
        if not rules.env_allowed(name):
            yield RejectedEdit(device=device, kind="env_name", edit=_shown(name))
        elif pattern is None or not pattern.fullmatch(value):
            yield RejectedEdit(device=device, kind="env_value", edit=_shown(f"{name}={value}"))
        elif own is not None and name in rules.visible and f"{name}={value}" not in own.visible:
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
