"""Which CDI container edits a node's backend may hand a container (pure).

The inventory arrives over the bus and is untrusted (DESIGN.md, "Trust boundaries"): whatever
it says, a container gets only the device nodes and environment variables that the node's own
backend produces (HARDWARE.md 1.3, 3.5), under the host paths documented for them. Anything
else fails the claim with `ForbiddenEditError`, naming each device and edit; this module only
decides (the preparer logs and counts). Mounts and hooks are never produced from an inventory,
so none is allowed at all; `check_spec` refuses them in a built spec.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.errors import ClaimError

__all__ = [
    "BACKENDS",
    "EDIT_KINDS",
    "BackendRules",
    "DeviceEdits",
    "ForbiddenEditError",
    "RejectedEdit",
    "check",
    "check_spec",
    "rules_for",
]

EDIT_KINDS = ("device_node", "host_path", "env_name", "env_value", "mount", "hook")
"""The `kind` label of `dra_prepare_rejected_edits_total`."""
_SHOWN = 96  # characters of a rejected edit quoted in errors and logs
_MAX_LISTED = 8  # rejected edits named in one claim's error

# The driver's own variables, on every backend (cdi.edits, dra.opaque, shares of a device).
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
_CONSUMED_ENV = re.compile(r"DRA_SUITE_CONSUMED_[A-Z0-9_]{1,200}")
_ASCEND_ENV = frozenset({"ASCEND_VISIBLE_DEVICES", "ASCEND_RUNTIME_OPTIONS"})
_NVIDIA_ENV = frozenset(
    {
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    }
)
# Values that select devices: only ids, never a runtime keyword (`all`, `none`, `void`).
_VALUES = {
    "ASCEND_VISIBLE_DEVICES": re.compile(r"\d{1,5}(,\d{1,5})*"),
    "ASCEND_RUNTIME_OPTIONS": re.compile(r"VIRTUAL"),
    "NVIDIA_VISIBLE_DEVICES": re.compile(
        r"(?!(?i:all|none|void)(,|$))[A-Za-z0-9][A-Za-z0-9/_.:-]{0,127}"
        r"(,(?!(?i:all|none|void)(,|$))[A-Za-z0-9][A-Za-z0-9/_.:-]{0,127})*"
    ),
}
_ASCEND_NODES = re.compile(r"/dev/(davinci\d{1,5}|davinci_manager|devmm_svm|hisi_hdc)")
_NVIDIA_NODES = re.compile(
    r"/dev/(nvidia\d{1,5}|nvidiactl|nvidia-uvm|nvidia-uvm-tools|nvidia-caps/nvidia-cap\d{1,7})"
)
_VNPU_HOST = re.compile(r"/dev/davinci(\d{1,5})")
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
        # A static vNPU: host /dev/vdavinci<N> is the container's /dev/davinci<N> (HARDWARE 3.5).
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


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceEdits:
    """The edits one inventory device brings into a claim's spec."""

    device: str
    nodes: Sequence[tuple[str, str]]
    """(container path, host path; empty host path = same path)."""
    env: Mapping[str, str]


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


def _rejected(rules: BackendRules, edits: DeviceEdits) -> Iterable[RejectedEdit]:
    device = edits.device[:_SHOWN]
    for path, host in edits.nodes:
        if not any(pattern.fullmatch(path) for pattern in rules.nodes):
            yield RejectedEdit(device=device, kind="device_node", edit=_shown(path))
        elif not rules.host_allowed(path, host):
            yield RejectedEdit(
                device=device, kind="host_path", edit=f"{_shown(host)} as {_shown(path)}"
            )
    for name, value in edits.env.items():
        pattern = _VALUES.get(name)
        if not rules.env_allowed(name):
            yield RejectedEdit(device=device, kind="env_name", edit=_shown(name))
        elif pattern is not None and not pattern.fullmatch(value):
            yield RejectedEdit(device=device, kind="env_value", edit=_shown(f"{name}={value}"))


def check(*, backend: str, claim_uid: str, devices: Sequence[DeviceEdits]) -> None:
    """Raise `ForbiddenEditError` when any device's edits are outside `backend`'s allowlist."""
    rules = rules_for(backend)
    rejected = [edit for edits in devices for edit in _rejected(rules, edits)]
    if rejected:
        raise _error(backend=backend, claim_uid=claim_uid, rejected=rejected)


def check_spec(spec: Mapping[str, Any], *, claim_uid: str, backend: str) -> None:
    """Refuse mounts, hooks and any other edit beyond env and device nodes in a built spec."""
    rejected = []
    scopes = [("(all devices)", spec.get("containerEdits") or {})]
    scopes += [(str(d.get("name", "")), d.get("containerEdits") or {}) for d in spec["devices"]]
    for name, edits in scopes:
        for key in sorted(set(edits) - {"env", "deviceNodes"}):
            kind = {"mounts": "mount", "hooks": "hook"}.get(key, "mount")
            rejected.append(RejectedEdit(device=name[:_SHOWN], kind=kind, edit=_shown(key)))
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
