"""Requests sent to both the API emulator and the real kube-apiserver, and the differences in
their answers that are known (each with why, mirrored in docs/emulator-differences.md).

A case is one request in a namespace and on a node of its own; `setup` requests run first on
both servers, and only the last request's answer is compared: its status code, its reason and
the field paths of its causes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CASES", "KNOWN_DIFFERENCES", "Case", "Request"]

Obj = dict[str, Any]
_R = "/apis/resource.k8s.io/v1"
DRIVER = "parity.dra-suite.io"


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    body: Obj | None = None
    content_type: str = "application/json"


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    request: Request
    setup: tuple[Request, ...] = field(default_factory=tuple)


def _class(name: str, cel: str = "true") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": cel}}]},
    }  # fmt: skip


def _slice(name: str, node: str, devices: list[Obj]) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
        "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
    }  # fmt: skip


def _claim(name: str, requests: list[Obj], **spec: Any) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": requests, **spec}},
    }  # fmt: skip


def _exactly(name: str = "r", **fields: Any) -> Obj:
    return {"name": name, "exactly": {"deviceClassName": "parity-class", **fields}}


def cases(namespace: str, node: str) -> list[Case]:
    """Every case, in `namespace` and on `node` (both exist on both servers)."""
    ns = f"/api/v1/namespaces/{namespace}"
    claims = f"{_R}/namespaces/{namespace}/resourceclaims"
    slices = f"{_R}/resourceslices"
    dev = [{"name": "dev-0"}]
    return [
        Case("deviceclass-valid", Request("POST", f"{_R}/deviceclasses",
                                          _class(f"ok-{namespace}"))),
        Case("deviceclass-cel-does-not-compile", Request(
            "POST", f"{_R}/deviceclasses", _class(f"bad-{namespace}", "device.driver ==")),
        ),
        Case("deviceclass-cel-not-bool", Request(
            "POST", f"{_R}/deviceclasses", _class(f"int-{namespace}", "1 + 1")),
        ),
        Case("slice-valid", Request("POST", slices, _slice(f"s-{node}", node, dev))),
        Case("slice-device-name-uppercase", Request(
            "POST", slices, _slice(f"u-{node}", node, [{"name": "Dev-0"}]))),
        Case("slice-too-many-devices", Request(
            "POST", slices, _slice(f"m-{node}", node, [{"name": f"d-{i}"} for i in range(129)]))),
        Case("slice-duplicate-device", Request(
            "POST", slices, _slice(f"d-{node}", node, [{"name": "a"}, {"name": "a"}]))),
        Case("slice-attribute-two-values", Request("POST", slices, _slice(
            f"a-{node}", node, [{"name": "a", "attributes": {"x": {"int": 1, "bool": True}}}]))),
        Case("slice-field-selector-list", Request(
            "GET", f"{slices}?fieldSelector=spec.nodeName%3D{node}")),
        Case("slice-unsupported-field-selector", Request(
            "GET", f"{slices}?fieldSelector=spec.foo%3Dbar")),
        Case("claim-valid", Request("POST", claims, _claim("ok", [_exactly()]))),
        Case("claim-count-zero", Request(
            "POST", claims, _claim("zero", [_exactly(allocationMode="ExactCount", count=0)]))),
        Case("claim-exactly-and-first-available", Request("POST", claims, _claim("both", [
            {**_exactly(), "firstAvailable": [{"name": "a", "deviceClassName": "parity-class"}]},
        ]))),
        Case("claim-no-request-kind", Request("POST", claims, _claim("none", [{"name": "r"}]))),
        Case("claim-request-name-invalid", Request(
            "POST", claims, _claim("badname", [_exactly(name="R_1")]))),
        Case("claim-opaque-not-an-object", Request("POST", claims, _claim("opaque", [_exactly()],
            config=[{"opaque": {"driver": DRIVER, "parameters": [1, 2]}}]))),
        Case("claim-unknown-field", Request(
            "POST", f"{claims}?fieldValidation=Strict",
            {**_claim("unknown", [_exactly()]), "spec": {"devices": {"requests": [_exactly()]},
                                                         "bogus": 1}})),
        Case("claim-get-missing", Request("GET", f"{claims}/missing")),
        Case("claim-delete-missing", Request("DELETE", f"{claims}/missing")),
        Case("claim-create-twice", Request("POST", claims, _claim("twice", [_exactly()])),
             setup=(Request("POST", claims, _claim("twice", [_exactly()])),)),
        Case("claim-update-stale", Request(
            "PUT", f"{claims}/stale",
            {**_claim("stale", [_exactly()]), "metadata": {"name": "stale",
                                                          "resourceVersion": "1"}}),
             setup=(Request("POST", claims, _claim("stale", [_exactly()])),)),
        Case("claim-spec-immutable", Request(
            "PATCH", f"{claims}/frozen",
            {"spec": {"devices": {"requests": [_exactly(name="other")]}}},
            "application/merge-patch+json"),
             setup=(Request("POST", claims, _claim("frozen", [_exactly()])),)),
        Case("claim-admin-access-unlabelled-namespace", Request(
            "POST", claims, _claim("admin", [_exactly(adminAccess=True)]))),
        Case("namespace-get", Request("GET", ns)),
        Case("token-review-garbage", Request(
            "POST", "/apis/authentication.k8s.io/v1/tokenreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
             "spec": {"token": "not-a-token"}})),
    ]  # fmt: skip


CASES = cases
KNOWN_DIFFERENCES: dict[str, str] = {
    "deviceclass-cel-does-not-compile": "the emulator does not compile DeviceClass selectors",
    "deviceclass-cel-not-bool": "the emulator does not type-check DeviceClass selectors",
    "claim-unknown-field": (
        "kube refuses an unknown field under fieldValidation=Strict while decoding (400 "
        "BadRequest); the emulator finds it in schema validation (422 Invalid, its path)"
    ),
}
"""Case name -> why the emulator answers differently (also in docs/emulator-differences.md)."""
