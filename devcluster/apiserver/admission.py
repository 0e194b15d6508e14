"""Admin access to devices (KEP-5018), admitted as kube-apiserver's registry does (pure).

A ResourceClaim or ResourceClaimTemplate created with an `exactly` request that sets
`adminAccess: true`, and a claim status update that first grants admin access to an allocated
device, are refused unless the namespace carries `resource.kubernetes.io/admin-access: "true"`
(pkg/registry/resource/utils.go: `AuthorizedForAdmin`, `AuthorizedForAdminStatus`). The field
is dropped before this check when DRAAdminAccess is off (`strategy.drop_disabled_fields`). The
errors are part of the 422 Invalid, listed before the validation errors, with kube's words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from devcluster.apiserver.errors import FieldError

__all__ = ["ADMIN_ACCESS_LABEL", "admin_access"]

ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
_CLAIMS = "resource.k8s.io/resourceclaims"
_TEMPLATES = "resource.k8s.io/resourceclaimtemplates"

Obj = dict[str, Any]
NamespaceLookup = Callable[[str], Obj | None]


def _requested(requests: list[Any]) -> str | None:
    """The path of the first `exactly` request asking for admin access (subrequests cannot)."""
    for index, request in enumerate(requests):
        exactly = (request or {}).get("exactly") or {}
        if exactly.get("adminAccess") is True:
            return f"spec.devices.requests[{index}].adminAccess"
    return None


def _granted(status: Obj | None) -> str | None:
    results = (((status or {}).get("allocation") or {}).get("devices") or {}).get("results")
    for index, result in enumerate(results or []):
        if (result or {}).get("adminAccess") is True:
            return f"status.allocation.devices.results[{index}].adminAccess"
    return None


def _path(storage: str, obj: Obj, old: Obj | None) -> str | None:
    """Where `obj` asks for admin access that must be checked now; None when nothing must be."""
    if storage == _TEMPLATES and old is None:
        spec = ((obj.get("spec") or {}).get("spec") or {}).get("devices") or {}
        return _requested(spec.get("requests") or [])
    if storage != _CLAIMS:
        return None
    if old is None:  # the spec is immutable: checked once, on create
        return _requested(((obj.get("spec") or {}).get("devices") or {}).get("requests") or [])
    if _granted(old.get("status")):
        return None  # granted before: status.allocation is immutable
    return _granted(obj.get("status"))


def admin_access(
    storage: str, obj: Obj, old: Obj | None, namespace: NamespaceLookup
) -> list[FieldError]:
    """The field errors kube-apiserver gives `obj` for admin access; [] when it admits it."""
    path = _path(storage, obj, old)
    if path is None:
        return []
    name = str((obj.get("metadata") or {}).get("namespace") or "")
    found = namespace(name)
    if found is None:
        detail = (
            "Internal error: could not retrieve namespace to verify admin access: "
            f'namespaces "{name}" not found'
        )
        return [FieldError("InternalError", path, detail)]
    labels = (found.get("metadata") or {}).get("labels") or {}
    if labels.get(ADMIN_ACCESS_LABEL) != "true":
        detail = (
            "admin access to devices requires the "
            f"`{ADMIN_ACCESS_LABEL}: true` label on the containing namespace"
        )
        return [FieldError.forbidden(path, detail)]
    return []
