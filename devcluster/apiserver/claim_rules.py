"""ResourceClaim, ResourceClaimTemplate and DeviceClass rules beyond JSON schema (docs/contracts.md
§4.2+).

Same shape as `dra_rules`: object, stored object on update (or None), minor
version in; field errors out. Pure; no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from devcluster.apiserver import naming
from devcluster.apiserver.errors import FieldError

__all__ = ["validate_claim", "validate_claim_template", "validate_device_class"]

_MAX_REQUESTS = 32
_MAX_SUBREQUESTS = 8
_MAX_TOLERATIONS = 16
_MAX_CONFIGS = 32
_MAX_OPAQUE = 10 * 1024
_MAX_RESULTS = 32
_MAX_RESERVED_FOR = 256
_MAX_SELECTORS = 32
_MAX_CEL = 10 * 1024


def validate_claim(obj: dict[str, Any], old: dict[str, Any] | None, minor: int) -> list[FieldError]:
    errors = _claim_spec(obj.get("spec") or {}, "spec")
    if old is not None and obj.get("spec") != old.get("spec"):
        errors.append(FieldError.invalid("spec", "<object>", "field is immutable"))
    errors += _claim_status(obj.get("status") or {})
    return errors


def validate_claim_template(
    obj: dict[str, Any], old: dict[str, Any] | None, minor: int
) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors = _claim_spec(spec.get("spec") or {}, "spec.spec")
    if old is not None and spec != old.get("spec"):
        errors.append(FieldError.invalid("spec", "<object>", "field is immutable"))
    return errors


def validate_device_class(
    obj: dict[str, Any], old: dict[str, Any] | None, minor: int
) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors = _selectors(spec.get("selectors") or [], "spec.selectors")
    errors += _configs(spec.get("config") or [], "spec.config")
    return errors


def _claim_spec(spec: dict[str, Any], path: str) -> list[FieldError]:
    devices = spec.get("devices") or {}
    dpath = f"{path}.devices"
    requests = devices.get("requests") or []
    errors: list[FieldError] = []
    if len(requests) > _MAX_REQUESTS:
        errors.append(FieldError.too_many(f"{dpath}.requests", len(requests), _MAX_REQUESTS))
    seen: set[str] = set()
    for i, request in enumerate(requests):
        rpath = f"{dpath}.requests[{i}]"
        name = request.get("name") or ""
        errors += naming.dns_label(f"{rpath}.name", name)
        if name in seen:
            errors.append(FieldError.duplicate(f"{rpath}.name", name))
        seen.add(name)
        errors += _request(request, rpath)
    constraints = devices.get("constraints") or []
    if len(constraints) > 32:
        errors.append(FieldError.too_many(f"{dpath}.constraints", len(constraints), 32))
    errors += _configs(devices.get("config") or [], f"{dpath}.config")
    return errors


def _request(request: dict[str, Any], path: str) -> list[FieldError]:
    exactly, first = request.get("exactly"), request.get("firstAvailable")
    if (exactly is None) == (first is None):
        detail = "exactly one of `exactly` or `firstAvailable` is required"
        if exactly is None:
            return [FieldError.required(path, detail)]
        return [FieldError.invalid(path, "{exactly, firstAvailable}", detail)]
    if exactly is not None:
        return _exact(exactly, f"{path}.exactly")
    errors: list[FieldError] = []
    first = list(first or [])
    if len(first) > _MAX_SUBREQUESTS:
        errors.append(FieldError.too_many(f"{path}.firstAvailable", len(first), _MAX_SUBREQUESTS))
    for j, sub in enumerate(first):
        spath = f"{path}.firstAvailable[{j}]"
        errors += naming.dns_label(f"{spath}.name", sub.get("name") or "")
        errors += _exact(sub, spath)
    return errors


def _exact(request: dict[str, Any], path: str) -> list[FieldError]:
    errors = naming.dns_subdomain(f"{path}.deviceClassName", request.get("deviceClassName") or "")
    mode = request.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        errors.append(
            FieldError.not_supported(f"{path}.allocationMode", mode, ["All", "ExactCount"])
        )
    count = request.get("count")
    # `count` is omitempty: kube decodes 0 as unset and defaults it to 1.
    if mode == "ExactCount" and count is not None and count < 0:
        errors.append(FieldError.invalid(f"{path}.count", count, "must be greater than zero"))
    if mode == "All" and count:
        errors.append(
            FieldError.invalid(
                f"{path}.count", count, "must not be specified when allocationMode is 'All'"
            )
        )
    tolerations = request.get("tolerations") or []
    if len(tolerations) > _MAX_TOLERATIONS:
        errors.append(
            FieldError.too_many(f"{path}.tolerations", len(tolerations), _MAX_TOLERATIONS)
        )
    for k, toleration in enumerate(tolerations):
        errors += _toleration(toleration, f"{path}.tolerations[{k}]")
    errors += _selectors(request.get("selectors") or [], f"{path}.selectors")
    return errors


def _toleration(toleration: dict[str, Any], path: str) -> list[FieldError]:
    operator = toleration.get("operator") or "Equal"
    errors: list[FieldError] = []
    if operator not in ("Exists", "Equal"):
        errors.append(FieldError.not_supported(f"{path}.operator", operator, ["Equal", "Exists"]))
    key = toleration.get("key") or ""
    if key:
        errors += naming.label_name(f"{path}.key", key)
    elif operator != "Exists":
        errors.append(
            FieldError.invalid(
                f"{path}.operator", operator, "value must be Exists when `key` is empty"
            )
        )
    if operator == "Exists" and toleration.get("value"):
        errors.append(
            FieldError.invalid(
                f"{path}.operator", operator, "value must be empty when `operator` is 'Exists'"
            )
        )
    return errors


def _selectors(selectors: list[dict[str, Any]], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if len(selectors) > _MAX_SELECTORS:
        errors.append(FieldError.too_many(path, len(selectors), _MAX_SELECTORS))
    for i, selector in enumerate(selectors):
        expression = ((selector or {}).get("cel") or {}).get("expression") or ""
        if not expression:
            errors.append(FieldError.required(f"{path}[{i}].cel.expression"))
        elif len(expression) > _MAX_CEL:
            errors.append(FieldError.too_long(f"{path}[{i}].cel.expression", _MAX_CEL))
    return errors


def _configs(configs: list[dict[str, Any]], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if len(configs) > _MAX_CONFIGS:
        errors.append(FieldError.too_many(path, len(configs), _MAX_CONFIGS))
    for i, config in enumerate(configs):
        errors += _opaque((config or {}).get("opaque"), f"{path}[{i}].opaque")
    return errors


def _opaque(opaque: dict[str, Any] | None, path: str) -> list[FieldError]:
    if opaque is None:
        return []
    errors = naming.driver_name(f"{path}.driver", opaque.get("driver") or "")
    parameters = opaque.get("parameters")
    if parameters is None:
        errors.append(FieldError.required(f"{path}.parameters"))
    elif len(json.dumps(parameters, separators=(",", ":"))) > _MAX_OPAQUE:
        errors.append(FieldError.too_long(f"{path}.parameters", _MAX_OPAQUE))
    return errors


def _claim_status(status: dict[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    reserved = status.get("reservedFor") or []
    if len(reserved) > _MAX_RESERVED_FOR:
        errors.append(FieldError.too_many("status.reservedFor", len(reserved), _MAX_RESERVED_FOR))
    devices = ((status.get("allocation") or {}).get("devices")) or {}
    path = "status.allocation.devices"
    results = devices.get("results") or []
    if len(results) > _MAX_RESULTS:
        errors.append(FieldError.too_many(f"{path}.results", len(results), _MAX_RESULTS))
    for i, result in enumerate(results):
        rpath = f"{path}.results[{i}]"
        errors += naming.driver_name(f"{rpath}.driver", result.get("driver") or "")
        errors += naming.pool_name(f"{rpath}.pool", result.get("pool") or "")
        errors += naming.dns_label(f"{rpath}.device", result.get("device") or "")
        if not result.get("request"):
            errors.append(FieldError.required(f"{rpath}.request"))
    for i, config in enumerate(devices.get("config") or []):
        cpath = f"{path}.config[{i}]"
        source = (config or {}).get("source")
        if source not in ("FromClass", "FromClaim"):
            errors.append(
                FieldError.not_supported(f"{cpath}.source", source, ["FromClaim", "FromClass"])
            )
        errors += _opaque((config or {}).get("opaque"), f"{cpath}.opaque")
    for i, device in enumerate(status.get("devices") or []):
        dpath = f"status.devices[{i}]"
        conditions = device.get("conditions") or []
        if len(conditions) > 8:
            errors.append(FieldError.too_many(f"{dpath}.conditions", len(conditions), 8))
        data = device.get("data")
        if data is not None and len(json.dumps(data, separators=(",", ":"))) > _MAX_OPAQUE:
            errors.append(FieldError.too_long(f"{dpath}.data", _MAX_OPAQUE))
    return errors
