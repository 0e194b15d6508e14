"""Load and validate a sim profile: the devices a simulated node has, and faults to inject.

Read by the discovery agent (devices) and the health agent (faults present from the start).
Attribute values keep their YAML type (int, bool, string); `{version: "1.2.3"}` marks a semver.
A profile is either a path or the name of a profile shipped in `shared/sim/profiles/`.

Two optional per-device keys: `mig: {profiles: [1g.10gb, ...]}` publishes the GPU's MIG
placements of those H100-80GB profiles (NVIDIA MIG user guide) over a counter set, as the nvml
backend does; `shared: {memory: true}` (or a step quantity instead of `true`) offers that
capacity for consumption by several claims where the API server supports it. A device has
at most one of the two: MIG and sharing don't mix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shared import quantity, yamlload
from shared.errors import ConfigError
from shared.vendors.nvidia.mig import H100_80GB

# Profiles parsed in this process, by path and content: the agents of one process (discovery
# and health, or a simulated fleet's thousands) share one parse. A profile is never changed
# in place (a reload parses the new content).
_parsed: dict[tuple[str, str], SimProfile] = {}
_PARSED_KEPT = 16

__all__ = [
    "H100_MIG_PROFILES",
    "SHARED_STEP",
    "AttributeValue",
    "SimDevice",
    "SimDeviceNode",
    "SimFault",
    "SimProfile",
    "VersionValue",
    "load",
    "parse",
    "shipped",
]

PROFILES_DIR = Path(__file__).parent / "profiles"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
H100_MIG_PROFILES = tuple(p.name for p in H100_80GB)
"""The MIG profile names of an H100-80GB (NVIDIA MIG user guide), in GI profile table order."""
SHARED_STEP = "1Gi"
"""The request step (and minimum) of a shared capacity given as `true`."""


@dataclass(frozen=True, slots=True)
class VersionValue:
    """A semantic-version attribute (published as `version`, not `string`)."""

    version: str


AttributeValue = int | bool | str | VersionValue


@dataclass(frozen=True, slots=True)
class SimDeviceNode:
    path: str
    host_path: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimDevice:
    name: str
    kind: str
    uuid: str = ""
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)
    device_nodes: tuple[SimDeviceNode, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    mig_profiles: tuple[str, ...] = ()
    """MIG profiles whose placements are published as partitions (empty: no MIG)."""
    shared: dict[str, str] = field(default_factory=dict)
    """Capacity name -> request step, for capacity that several claims may consume."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimFault:
    device: str
    cause: str = "injected"
    code: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimProfile:
    name: str
    devices: tuple[SimDevice, ...]
    faults: tuple[SimFault, ...] = ()

    def device(self, name: str) -> SimDevice | None:
        return next((d for d in self.devices if d.name == name), None)


def shipped() -> list[str]:
    """Names of the profiles that ship with dra-suite."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load(name_or_path: str) -> SimProfile:
    """Load a shipped profile by name, or a profile file by path."""
    path = Path(name_or_path)
    if not path.suffix and (PROFILES_DIR / f"{name_or_path}.yaml").exists():
        path = PROFILES_DIR / f"{name_or_path}.yaml"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"sim profile {name_or_path!r}: {exc.strerror or exc}; shipped: {', '.join(shipped())}",
            field="sim_profile",
        ) from exc
    if (parsed := _parsed.get((str(path), text))) is not None:
        return parsed
    try:
        document = yamlload.load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"sim profile {path}: not YAML: {exc}", field="sim_profile") from exc
    parsed = parse(document, source=str(path))
    if len(_parsed) >= _PARSED_KEPT:
        _parsed.pop(next(iter(_parsed)))
    _parsed[(str(path), text)] = parsed
    return parsed


def parse(document: Any, *, source: str) -> SimProfile:
    if not isinstance(document, dict) or document.get("kind") != "SimProfile":
        raise _error(source, "", "must be a mapping with kind: SimProfile")
    name = str(document.get("metadata", {}).get("name", Path(source).stem))
    raw_devices = document.get("devices")
    if not isinstance(raw_devices, list) or not raw_devices:
        raise _error(source, "devices", "must be a non-empty list")
    devices = tuple(_device(raw, source, f"devices[{i}]") for i, raw in enumerate(raw_devices))
    names = [d.name for d in devices]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise _error(source, "devices", f"duplicate device names {duplicates}")
    faults = tuple(
        _fault(raw, source, f"faults[{i}]", set(names))
        for i, raw in enumerate(document.get("faults") or [])
    )
    return SimProfile(name=name, devices=devices, faults=faults)


def _device(raw: Any, source: str, where: str) -> SimDevice:
    if not isinstance(raw, dict):
        raise _error(source, where, "must be a mapping")
    name = str(raw.get("name", ""))
    if not _DNS_LABEL.match(name):
        raise _error(source, f"{where}.name", f"{name!r} is not a DNS label")
    attributes = {
        str(key): _attribute(value, source, f"{where}.attributes.{key}")
        for key, value in (raw.get("attributes") or {}).items()
    }
    nodes = tuple(
        SimDeviceNode(path=str(n["path"]), host_path=str(n.get("hostPath", "")))
        if isinstance(n, dict) and "path" in n
        else _raise(_error(source, f"{where}.deviceNodes[{i}]", "needs a path"))
        for i, n in enumerate(raw.get("deviceNodes") or [])
    )
    return SimDevice(
        name=name,
        kind=str(raw.get("kind", "sim")),
        uuid=str(raw.get("uuid", "")),
        attributes=attributes,
        capacity={str(k): str(v) for k, v in (raw.get("capacity") or {}).items()},
        device_nodes=nodes,
        env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        **_sharing(raw, source, where),
    )


def _sharing(raw: dict[Any, Any], source: str, where: str) -> dict[str, Any]:
    """The optional `mig` and `shared` keys as SimDevice fields (at most one of them)."""
    if raw.get("mig") is not None and raw.get("shared") is not None:
        raise _error(source, where, "has both mig and shared: MIG and sharing don't mix")
    capacity = {str(k) for k in (raw.get("capacity") or {})}
    return {
        "mig_profiles": _mig(raw.get("mig"), source, f"{where}.mig"),
        "shared": _shared(raw.get("shared"), source, f"{where}.shared", capacity),
    }


def _mig(raw: Any, source: str, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or set(raw) != {"profiles"}:
        raise _error(source, where, "must be a mapping with only the key profiles")
    profiles = raw["profiles"]
    if not isinstance(profiles, list) or not profiles:
        raise _error(source, f"{where}.profiles", "must be a non-empty list")
    for name in profiles:
        if name not in H100_MIG_PROFILES:
            known = ", ".join(H100_MIG_PROFILES)
            raise _error(source, f"{where}.profiles", f"{name!r} is not one of {known}")
    return tuple(dict.fromkeys(str(p) for p in profiles))


def _shared(raw: Any, source: str, where: str, capacity: set[str]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        raise _error(source, where, "must be a non-empty mapping of capacity names")
    steps: dict[str, str] = {}
    for key, value in raw.items():
        if key not in capacity:
            raise _error(source, f"{where}.{key}", "names no capacity of the device")
        if value is True:
            steps[str(key)] = SHARED_STEP
        elif isinstance(value, str) and (quantity.whole(value) or 0) > 0:
            steps[str(key)] = value
        else:
            raise _error(source, f"{where}.{key}", f"{value!r} is not true or a step quantity")
    return steps


def _attribute(value: Any, source: str, where: str) -> AttributeValue:
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, dict) and set(value) == {"version"}:
        return VersionValue(str(value["version"]))
    raise _error(source, where, f"{value!r} is not an int, bool, string or {{version: ...}}")


def _fault(raw: Any, source: str, where: str, devices: set[str]) -> SimFault:
    if not isinstance(raw, dict) or raw.get("device") not in devices:
        raise _error(source, f"{where}.device", "must name a device of the profile")
    return SimFault(
        device=str(raw["device"]),
        cause=str(raw.get("cause", "injected")),
        code=str(raw.get("code", "")),
        message=str(raw.get("message", "")),
    )


def _error(source: str, where: str, message: str) -> ConfigError:
    location = f"{source}: {where}" if where else source
    return ConfigError(f"sim profile {location}: {message}", field="sim_profile")


def _raise(error: ConfigError) -> SimDeviceNode:
    raise error
