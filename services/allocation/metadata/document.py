"""The DeviceMetadata document of one request of a claim, and where it lives (pure).

Field for field the `k8s.io/dynamic-resource-allocation/api/metadata` types (v1alpha1 from
1.36, v1beta1 from 1.37; identical fields): `metadata` (the claim's name, namespace and UID,
generation 1 as the Go helper writes it at prepare), `podClaimName` (the claim's
`resource.kubernetes.io/pod-claim-name` annotation, set for claims made from a template),
`requests` (one: the request, its devices with driver, pool, name and attributes in the
ResourceSlice attribute serialization). The file is a JSON stream holding the same document
once per version, newest first: a consumer takes the first version it knows.

Inside the container it is at `/var/run/kubernetes.io/dra-device-attributes/` +
`resourceclaims/<claim>/<request>/<driver>-metadata.json`, or
`resourceclaimtemplates/<pod claim name>/<request>/...` for a claim from a template. On the
host it is `<plugin data dir>/dra-device-metadata/<claim UID>_<request>.json`: keyed by UID,
like the checkpoint and the CDI spec, so that recovery finds orphans, and flat, so that a
prepare makes no directory (two `mkdir`s per claim cost more than writing the file). Claims
prepared before the flat layout mount `<claim UID>/<request>/metadata.json` (`legacy_host_path`)
and keep it: the claim's CDI spec, stored in its checkpoint record, says which a claim uses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = [
    "API_GROUP",
    "API_VERSIONS",
    "CONTAINER_DIR",
    "HOST_SEPARATOR",
    "HOST_SUBDIR",
    "KIND",
    "MAX_ATTRIBUTES",
    "attributes",
    "check_names",
    "container_path",
    "device_entry",
    "document",
    "encode_stream",
    "host_path",
    "legacy_host_path",
    "mount",
    "mounted_host_paths",
]

API_GROUP = "metadata.resource.k8s.io"
API_VERSIONS = ("v1beta1", "v1alpha1")
"""Written in this order, newest first (the Go helper's `EnableDeviceMetadata` order)."""
KIND = "DeviceMetadata"
CONTAINER_DIR = PurePosixPath("/var/run/kubernetes.io/dra-device-attributes")
_CLAIMS_SUBDIR = "resourceclaims"
_TEMPLATES_SUBDIR = "resourceclaimtemplates"
_FILE_SUFFIX = "-metadata.json"
HOST_SUBDIR = "dra-device-metadata"
"""Under the plugin data directory, as the Go helper names it."""
HOST_SEPARATOR = "_"
_HOST_SUFFIX = ".json"
_LEGACY_HOST_FILE = "metadata.json"
MAX_ATTRIBUTES = 32
"""`+k8s:maxProperties=32` on Device.Attributes."""
_MOUNT_OPTIONS = ("ro", "bind")
# k8s-short-name (a DNS label): claim request names and pod claim names become path segments.
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_VALUE_KINDS = ("int", "bool", "string", "version")


def container_path(
    *, driver: str, claim: str, pod_claim_name: str | None, request: str
) -> PurePosixPath:
    """Where a container finds the file (`ResourceClaimFilePath` / `...TemplateFilePath`)."""
    if pod_claim_name:
        return (
            CONTAINER_DIR / _TEMPLATES_SUBDIR / pod_claim_name / request / (driver + _FILE_SUFFIX)
        )
    return CONTAINER_DIR / _CLAIMS_SUBDIR / claim / request / (driver + _FILE_SUFFIX)


def host_path(root: PurePosixPath, *, claim_uid: str, request: str) -> PurePosixPath:
    """The file on the host; `root` is `<plugin data dir>/dra-device-metadata`. A UID holds no
    `_` and a request name (a DNS label) none either, so the name splits back unambiguously."""
    return root / f"{claim_uid}{HOST_SEPARATOR}{request}{_HOST_SUFFIX}"


def legacy_host_path(root: PurePosixPath, *, claim_uid: str, request: str) -> PurePosixPath:
    """Where claims prepared before the flat layout have the file (one directory per claim)."""
    return root / claim_uid / request / _LEGACY_HOST_FILE


def mounted_host_paths(spec: Mapping[str, Any] | None) -> frozenset[str]:
    """The host paths every mount of a CDI spec names (its devices' and the spec-level ones)."""
    if not spec:
        return frozenset()
    edits = [spec.get("containerEdits") or {}]
    edits += [device.get("containerEdits") or {} for device in spec.get("devices") or ()]
    return frozenset(str(mount["hostPath"]) for edit in edits for mount in edit.get("mounts") or ())


def mount(host: PurePosixPath, container: PurePosixPath) -> dict[str, Any]:
    """The CDI mount of the file: a read-only bind mount, as the Go helper's spec has it."""
    return {
        "hostPath": str(host),
        "containerPath": str(container),
        "options": list(_MOUNT_OPTIONS),
    }


def check_names(*, claim_uid: str, request: str, pod_claim_name: str | None) -> None:
    """Path segments must be DNS labels; the API server validates both, a forged one fails."""
    for what, name in (("request", request), ("pod claim name", pod_claim_name)):
        if name is not None and not _LABEL.fullmatch(name):
            raise ClaimError(
                f"prepare claim {claim_uid}: {what} {name[:64]!r} is not a DNS label",
                claim_uid=claim_uid,
            )


def attributes(device: inventory_pb2.Device) -> dict[str, dict[str, Any]]:
    """The device's attributes as its ResourceSlice serializes them, plus its `uuid` where the
    inventory has one and publishes none, at most `MAX_ATTRIBUTES`."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(device.attributes):
        value = device.attributes[name]
        kind = value.WhichOneof("value")
        if kind in _VALUE_KINDS:
            out[name] = {kind: getattr(value, kind)}
    if device.uuid and "uuid" not in out:
        out["uuid"] = {"string": device.uuid}
    return dict(sorted(list(out.items())[:MAX_ATTRIBUTES]))


def device_entry(*, driver: str, pool: str, device: inventory_pb2.Device) -> dict[str, Any]:
    entry: dict[str, Any] = {"driver": driver, "pool": pool, "name": device.name}
    if found := attributes(device):
        entry["attributes"] = found
    return entry


def document(
    *,
    name: str,
    namespace: str,
    uid: str,
    pod_claim_name: str | None,
    request: str,
    devices: Iterable[Mapping[str, Any]],
) -> dict[str, Any]:
    """The version-less body (no kind, no apiVersion) of one request's document."""
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1}
    }
    if pod_claim_name:
        body["podClaimName"] = pod_claim_name
    body["requests"] = [{"name": request, "devices": list(devices)}]
    return body


# Field order of the Go types (a body read back from the checkpoint has its keys sorted).
_ORDER = {
    "": ("kind", "apiVersion", "metadata", "podClaimName", "requests"),
    "metadata": ("name", "namespace", "uid", "generation"),
    "requests": ("name", "devices"),
    "devices": ("driver", "pool", "name", "attributes", "networkData"),
}


def _ordered(value: Any, field: str = "") -> Any:
    if isinstance(value, list):
        return [_ordered(item, field) for item in value]
    if not isinstance(value, Mapping) or field not in _ORDER:
        return value
    order = _ORDER[field]
    keys = sorted(value, key=lambda k: (order.index(k) if k in order else len(order), k))
    return {key: _ordered(value[key], key) for key in keys}


def encode_stream(body: Mapping[str, Any], versions: Sequence[str] = API_VERSIONS) -> bytes:
    """The file: `body` once per version, newest first, each object compact on a line of its
    own, its fields in the Go types' order, so that the same body always gives the same
    bytes."""
    return b"".join(
        json.dumps(
            _ordered({"kind": KIND, "apiVersion": f"{API_GROUP}/{version}", **body}),
            separators=(",", ":"),
        ).encode()
        + b"\n"
        for version in versions
    )
