"""CDI specs: one transient spec per prepared claim, named after the claim UID (docs/contracts.md
§7).

Vendor `k8s.<driver>`, class `claim`, device names `<claimUID>-<device>` (plus the share ID for
a shared device) so that names are never reused across claims; the file is
`k8s.<driver>-claim_<claimUID>.json` in the CDI root. Building and validating specs is pure;
`CDIWriter` only writes and removes files. `cdiVersion` is the minimum the used fields need.
Nodes every device of the spec needs (a vendor's control nodes) go into the spec-level
`containerEdits`, which a runtime applies once when any device of the spec is used.
`validate` checks a spec against the CDI JSON schema (`schema/`) and what the schema does
not express (name syntax and length, versions, empty edits); an invalid spec is never written.

A device under several requests of one claim gets a name per request (`device_names`).
Device names stay within the 63 characters of a CDI name segment: a shared device's name
carries as much of its share ID (dashes dropped) as fits, at least 8 characters;
where even that does not fit, the part after the claim UID is a hash of device and share.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from services.allocation.cdi.schema_check import schema_problems
from shared import atomicfile

__all__ = [
    "CDI_CLASS",
    "MAX_NAME",
    "CDIDevice",
    "CDIWriter",
    "build_spec",
    "device_id",
    "device_name",
    "device_names",
    "kind",
    "required_version",
    "spec_file_name",
    "validate",
    "vendor",
]

log = structlog.get_logger(__name__)

CDI_CLASS = "claim"
_SPEC_MODE = 0o644  # container runtimes read specs; they hold no secrets
# pkg/parser/parser.go of container-device-interface.
_VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_EDIT_KEYS = ("env", "deviceNodes", "mounts", "hooks", "netDevices", "additionalGids")
MAX_NAME = 63
"""SPEC.md: a CDI class or device name segment is at most 63 characters."""
_MIN_SHARE_CHARS = 8
_SHARE_CHARS = re.compile(r"^[A-Za-z0-9]+$")


@dataclass(frozen=True, slots=True, kw_only=True)
class CDIDevice:
    """One CDI device entry: its name and container edits."""

    name: str
    env: Mapping[str, str]
    device_nodes: Sequence[tuple[str, str]] = ()
    """(path in the container, path on the host; empty host path = same path)."""
    mounts: Sequence[Mapping[str, Any]] = ()
    """CDI mounts (the request's device metadata file, on its first device)."""


def vendor(driver: str) -> str:
    return f"k8s.{driver}"


def kind(driver: str) -> str:
    return f"{vendor(driver)}/{CDI_CLASS}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    """GenerateTransientSpecName(vendor, class, claimUID) + `.json`."""
    return f"{vendor(driver)}-{CDI_CLASS}_{claim_uid.replace('/', '_')}.json"


def device_name(claim_uid: str, device: str, share_id: str | None = None) -> str:
    """`<claimUID>-<device>`, plus `-<share ID prefix>` for a share; at most 63 characters."""
    if share_id is None:
        name = f"{claim_uid}-{device}"
        return name if len(name) <= MAX_NAME else _hashed(claim_uid, device)
    share = share_id.replace("-", "")
    room = MAX_NAME - len(claim_uid) - len(device) - 2
    if _SHARE_CHARS.match(share) and (len(share) <= room or room >= _MIN_SHARE_CHARS):
        return f"{claim_uid}-{device}-{share[:room]}"
    return _hashed(claim_uid, f"{device}/{share_id}")


def device_names(claim_uid: str, uses: Sequence[tuple[str, str, str | None]]) -> list[str]:
    """The CDI device name of each (request, device, share ID) of a claim, in order.

    A device (or share) under one request is `device_name`; one under several requests (two
    admin-access requests, say) gets one name per request, `<claimUID>-<device>-<request>`
    or, where that does not fit, a hash of all three, so that names stay unique in the spec.
    """
    requests: dict[tuple[str, str | None], set[str]] = {}
    for request, device, share_id in uses:
        requests.setdefault((device, share_id), set()).add(request)
    names = []
    for request, device, share_id in uses:
        if len(requests[(device, share_id)]) == 1:
            names.append(device_name(claim_uid, device, share_id))
            continue
        name = f"{claim_uid}-{device}-{request}"
        if share_id is not None or len(name) > MAX_NAME or not _DEVICE_NAME.match(name):
            name = _hashed(claim_uid, f"{device}/{share_id or ''}/{request}")
        names.append(name)
    return names


def _hashed(claim_uid: str, key: str) -> str:
    """`<claimUID>-<sha256(key)>` cut to 63 characters (the whole thing hashed for long UIDs)."""
    digest = hashlib.sha256(f"{claim_uid}/{key}".encode()).hexdigest()
    room = MAX_NAME - len(claim_uid) - 1
    if room < 16:
        return digest[:MAX_NAME]
    return f"{claim_uid}-{digest[:room]}"


def device_id(driver: str, name: str) -> str:
    """The fully qualified CDI device name `vendor/class=name` returned to the kubelet."""
    return f"{kind(driver)}={name}"


def build_spec(
    *,
    driver: str,
    devices: Sequence[CDIDevice],
    common_nodes: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """The spec of one claim; `common_nodes` go into the spec-level container edits."""
    spec_devices = [
        {
            "name": device.name,
            "containerEdits": _edits(device.env, device.device_nodes, device.mounts),
        }
        for device in devices
    ]
    spec: dict[str, Any] = {"cdiVersion": "", "kind": kind(driver), "devices": spec_devices}
    if common_nodes:
        spec["containerEdits"] = _edits({}, common_nodes)
    spec["cdiVersion"] = required_version(spec)
    return spec


def _edits(
    env: Mapping[str, str],
    nodes: Sequence[tuple[str, str]],
    mounts: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    edits: dict[str, Any] = {}
    if env:
        edits["env"] = [f"{k}={v}" for k, v in sorted(env.items())]
    device_nodes = [
        {"path": path, "hostPath": host} if host and host != path else {"path": path}
        for path, host in nodes
    ]
    if device_nodes:
        edits["deviceNodes"] = device_nodes
    if mounts:
        edits["mounts"] = [dict(m) for m in mounts]
    return edits


def required_version(spec: Mapping[str, Any]) -> str:
    """The lowest cdiVersion that allows the fields used (maximises runtime compatibility)."""
    needed = (0, 3, 0)
    edits = [spec.get("containerEdits") or {}]
    for device in spec.get("devices", ()):
        if device.get("name", "")[:1].isdigit():
            needed = max(needed, (0, 5, 0))
        if "annotations" in device:
            needed = max(needed, (0, 6, 0))
        edits.append(device.get("containerEdits") or {})
    if any("hostPath" in node for edit in edits for node in edit.get("deviceNodes", ())):
        needed = max(needed, (0, 5, 0))
    if "annotations" in spec or "." in str(spec.get("kind", "")).partition("/")[2]:
        needed = max(needed, (0, 6, 0))
    return ".".join(str(part) for part in needed)


def validate(spec: Mapping[str, Any]) -> list[str]:
    """What a CDI loader would reject in `spec`; an empty list means valid."""
    problems = schema_problems(spec)
    for key in ("cdiVersion", "kind", "devices"):
        if not spec.get(key):
            problems.append(f"{key} is required")
    vendor_part, _, class_part = str(spec.get("kind", "")).partition("/")
    if not _VENDOR_OR_CLASS.match(vendor_part) or not _VENDOR_OR_CLASS.match(class_part):
        problems.append(f"kind {spec.get('kind')!r} is not vendor/class")
    names: set[str] = set()
    for device in spec.get("devices") or ():
        name = str(device.get("name", ""))
        if not _DEVICE_NAME.match(name) or len(name) > MAX_NAME:
            problems.append(f"device name {name!r} is invalid")
        if name in names:
            problems.append(f"device name {name!r} is duplicated")
        names.add(name)
        edits = device.get("containerEdits") or {}
        if not any(edits.get(key) for key in _EDIT_KEYS):
            problems.append(f"device {name!r} has empty container edits")
    declared = str(spec.get("cdiVersion", ""))
    if declared and _version_tuple(declared) < _version_tuple(required_version(spec)):
        problems.append(f"cdiVersion {declared} is below {required_version(spec)}")
    return problems


def _version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return (0,)


class CDIWriter:
    """Writes and removes this driver's per-claim specs under the CDI root.

    `durable=False` (the agent's choice) writes a spec without fsyncs: a runtime reads it from
    the page cache all the same, and a killed agent leaves it whole. Only a power loss can leave
    it empty or old, and the reboot that comes with one wipes /var/run/cdi (a tmpfs on nodes)
    anyway; at the next start recovery compares every prepared claim's spec with its record
    (`matches`) and rewrites what differs, before the kubelet starts any container again.
    """

    def __init__(self, root: Path, *, driver: str, durable: bool = True) -> None:
        self.root = root
        self.driver = driver
        self.durable = durable
        self.writes: collections.Counter[str] = collections.Counter()
        """Spec files written per prepared claim UID (regenerations included); forgotten at
        `remove`."""

    def path(self, claim_uid: str) -> Path:
        return self.root / spec_file_name(self.driver, claim_uid)

    def prepare_root(self) -> None:
        atomicfile.make_dirs(self.root, mode=0o755)  # runtimes read it; only we write

    async def write(self, claim_uid: str, spec: Mapping[str, Any]) -> None:
        """Replace the claim's spec atomically: a runtime never reads half a spec."""
        await asyncio.to_thread(self.write_blocking, claim_uid, encode(spec))

    def write_blocking(self, claim_uid: str, data: bytes) -> None:
        """`write` of an `encode`d spec, blocking, for a worker thread."""
        if self.durable:
            atomicfile.write_atomic(self.path(claim_uid), data, mode=_SPEC_MODE)
        else:
            atomicfile.write_and_rename(self.path(claim_uid), data, mode=_SPEC_MODE, sync=False)
        self.writes[claim_uid] += 1

    def matches(self, claim_uid: str, spec: Mapping[str, Any]) -> bool:
        """Whether the claim's spec file holds exactly `spec` (at start: a power loss may have
        left a spec that was not written durably empty)."""
        try:
            return self.path(claim_uid).read_bytes() == encode(spec)
        except OSError:
            return False

    async def remove(self, claim_uid: str) -> bool:
        removed = await asyncio.to_thread(atomicfile.remove, self.path(claim_uid))
        self.writes.pop(claim_uid, None)  # per claim lifetime: no growth per claim ever seen
        return removed

    def exists(self, claim_uid: str) -> bool:
        return self.path(claim_uid).exists()

    def remove_temporaries(self) -> list[Path]:
        """Remove half-written specs of this driver left by a crash (`.<spec>.tmp-<pid>`).

        Runtimes only load `*.json`, so they never saw them; they are still litter. Call only
        when no write of this driver can be in flight (at start, under the instance lock).
        """
        prefix = f".{vendor(self.driver)}-{CDI_CLASS}_"
        removed = sorted(self.root.glob(f"{prefix}*.json.tmp-*"))
        for path in removed:
            atomicfile.remove(path)
        return removed

    def claim_uids(self) -> list[str]:
        """UIDs of the claims that have a spec of this driver on disk."""
        prefix = f"{vendor(self.driver)}-{CDI_CLASS}_"
        return sorted(
            path.name.removeprefix(prefix).removesuffix(".json")
            for path in self.root.glob(f"{prefix}*.json")
        )


def encode(spec: Mapping[str, Any]) -> bytes:
    """The spec file's bytes: compact, since the runtime is the only reader and the C encoder
    is several times faster than the indenting one, on the prepare path."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
