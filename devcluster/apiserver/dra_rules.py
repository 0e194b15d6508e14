"""ResourceSlice and DeviceTaintRule rules that JSON schema cannot express (docs/contracts.md §4.1,
5).

`validate_slice` / `validate_taint_rule` take the object, the stored object on
update (or None) and the Kubernetes minor version; they return field errors.
Pure; no I/O.
"""

from __future__ import annotations

from typing import Any

from devcluster.apiserver import naming
from devcluster.apiserver.errors import FieldError

__all__ = ["validate_slice", "validate_taint", "validate_taint_rule"]

_MAX_DEVICES = 128
_MAX_DEVICES_ADVANCED = 64
_MAX_ATTRS_AND_CAPS = 32
_MAX_STRING = 64
_NODE_FIELDS = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
_DEVICE_NODE_FIELDS = ("nodeName", "nodeSelector", "allNodes")


def validate_slice(obj: dict[str, Any], old: dict[str, Any] | None, minor: int) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors = naming.driver_name("spec.driver", spec.get("driver") or "")
    errors += _pool(spec.get("pool") or {})
    errors += _node_selection(spec)
    devices = spec.get("devices") or []
    errors += _device_count(devices, minor)
    per_device = bool(spec.get("perDeviceNodeSelection"))
    seen: set[str] = set()
    for i, device in enumerate(devices):
        path = f"spec.devices[{i}]"
        name = device.get("name") or ""
        if name in seen:  # kube 1.35+ reports the whole entry, 1.34 its name
            errors.append(FieldError.duplicate(path if minor >= 35 else f"{path}.name", name))
        seen.add(name)
        errors += _device(device, path, minor=minor, per_device=per_device)
    errors += _shared_counters(spec, minor)
    if old is not None:
        errors += _immutable_slice_fields(spec, old.get("spec") or {})
    return errors


def _pool(pool: dict[str, Any]) -> list[FieldError]:
    errors = naming.pool_name("spec.pool.name", pool.get("name") or "")
    generation = pool.get("generation")
    if isinstance(generation, int) and generation < 0:
        detail = "must be greater than or equal to 0"
        errors.append(FieldError.invalid("spec.pool.generation", generation, detail))
    count = pool.get("resourceSliceCount")
    if isinstance(count, int) and count <= 0:
        detail = "must be greater than zero"
        errors.append(FieldError.invalid("spec.pool.resourceSliceCount", count, detail))
    return errors


def _node_selection(spec: dict[str, Any]) -> list[FieldError]:
    chosen = [f for f in _NODE_FIELDS if spec.get(f)]
    choices = "`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"
    if not chosen:
        return [FieldError.required("spec", f"exactly one of {choices} is required")]
    if len(chosen) > 1:
        return [FieldError.invalid("spec", "{" + ", ".join(chosen) + "}",
                                   f"exactly one of {choices} is required, but multiple fields are set")]  # fmt: skip # noqa: E501
    selector = spec.get("nodeSelector")
    if selector is not None and len(selector.get("nodeSelectorTerms") or []) != 1:
        terms = len(selector.get("nodeSelectorTerms") or [])
        detail = "must have exactly one node selector term"
        return [FieldError.invalid("spec.nodeSelector.nodeSelectorTerms", terms, detail)]
    return []


def _device_count(devices: list[dict[str, Any]], minor: int) -> list[FieldError]:
    if len(devices) > _MAX_DEVICES:
        return [FieldError.too_many("spec.devices", len(devices), _MAX_DEVICES)]
    if minor >= 35 and len(devices) > _MAX_DEVICES_ADVANCED and any(map(_advanced, devices)):
        return [FieldError.too_many("spec.devices", len(devices), _MAX_DEVICES_ADVANCED)]
    return []


def _advanced(device: dict[str, Any]) -> bool:
    if device.get("taints") or device.get("consumesCounters"):
        return True
    lists = ("ints", "bools", "strings", "versions")
    return any(k in a for a in (device.get("attributes") or {}).values() for k in lists)


def _device(device: dict[str, Any], path: str, *, minor: int, per_device: bool) -> list[FieldError]:
    errors = naming.dns_label(f"{path}.name", device.get("name") or "")
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > _MAX_ATTRS_AND_CAPS:
        total = len(attributes) + len(capacity)
        errors.append(FieldError.too_many(f"{path}.attributes", total, _MAX_ATTRS_AND_CAPS))
    for key, attribute in attributes.items():
        errors += naming.qualified_name(f"{path}.attributes[{key}]", key)
        errors += _attribute(attribute or {}, f"{path}.attributes[{key}]")
    for key, cap in capacity.items():
        errors += naming.qualified_name(f"{path}.capacity[{key}]", key)
        errors += naming.quantity(f"{path}.capacity[{key}].value", (cap or {}).get("value"))
        if (cap or {}).get("requestPolicy") and not device.get("allowMultipleAllocations"):
            detail = "only allowed when allowMultipleAllocations is true"
            errors.append(FieldError.forbidden(f"{path}.capacity[{key}].requestPolicy", detail))
    taints = device.get("taints") or []
    limit = 4 if minor == 34 else 16
    if len(taints) > limit:
        errors.append(FieldError.too_many(f"{path}.taints", len(taints), limit))
    for j, taint in enumerate(taints):
        errors += validate_taint(taint or {}, f"{path}.taints[{j}]", minor)
    errors += _consumes_counters(device, path, minor)
    errors += _binding_conditions(device, path)
    node_fields = [f for f in _DEVICE_NODE_FIELDS if device.get(f)]
    if per_device and len(node_fields) != 1:
        detail = "exactly one of `nodeName`, `nodeSelector`, `allNodes` is required"
        errors.append(FieldError.invalid(path, "{" + ", ".join(node_fields) + "}", detail))
    elif not per_device and node_fields:
        detail = "only allowed when spec.perDeviceNodeSelection is true"
        errors.append(FieldError.forbidden(f"{path}.{node_fields[0]}", detail))
    return errors


def _attribute(attribute: dict[str, Any], path: str) -> list[FieldError]:
    values = [k for k, v in attribute.items() if v is not None]
    if not values:
        return [FieldError.required(path, "exactly one value must be specified")]
    if len(values) > 1:
        return [FieldError.invalid(path, "{" + ", ".join(values) + "}",
                                   "exactly one value must be specified")]  # fmt: skip
    kind, value = values[0], attribute[values[0]]
    items = value if kind.endswith("s") and isinstance(value, list) else [value]
    if kind.endswith("s") and not items:
        return [FieldError.required(f"{path}.{kind}", "must not be empty")]
    errors: list[FieldError] = []
    for item in items:
        if kind in ("string", "strings") and len(item.encode()) > _MAX_STRING:
            errors.append(FieldError.too_long(f"{path}.{kind}", _MAX_STRING))
        elif kind in ("version", "versions"):
            errors += naming.semver(f"{path}.{kind}", item)
    return errors


def validate_taint(taint: dict[str, Any], path: str, minor: int) -> list[FieldError]:
    """One DeviceTaint: key is a label name, value a label value, effect a known one."""
    key = taint.get("key") or ""
    errors = naming.label_name(f"{path}.key", key) if key else [FieldError.required(f"{path}.key")]
    errors += naming.label_value(f"{path}.value", taint.get("value") or "")
    effects = ["NoSchedule", "NoExecute"] + (["None"] if minor >= 35 else [])
    effect = taint.get("effect")
    if not effect:
        errors.append(FieldError.required(f"{path}.effect"))
    elif effect not in effects:
        errors.append(FieldError.not_supported(f"{path}.effect", effect, effects))
    return errors


def _consumes_counters(device: dict[str, Any], path: str, minor: int) -> list[FieldError]:
    consumptions = device.get("consumesCounters") or []
    errors: list[FieldError] = []
    if minor >= 35 and len(consumptions) > 2:
        errors.append(FieldError.too_many(f"{path}.consumesCounters", len(consumptions), 2))
    total = 0
    for k, consumption in enumerate(consumptions):
        cpath = f"{path}.consumesCounters[{k}]"
        errors += naming.dns_label(f"{cpath}.counterSet", consumption.get("counterSet") or "")
        counters = consumption.get("counters") or {}
        total += len(counters)
        if minor >= 35 and len(counters) > 32:
            errors.append(FieldError.too_many(f"{cpath}.counters", len(counters), 32))
        errors += _counters(counters, f"{cpath}.counters")
    if minor == 34 and total > 32:
        errors.append(FieldError.too_many(f"{path}.consumesCounters", total, 32))
    return errors


def _counters(counters: dict[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    for name, counter in counters.items():
        errors += naming.dns_label(f"{path}[{name}]", name)
        errors += naming.quantity(f"{path}[{name}].value", (counter or {}).get("value"))
    return errors


def _binding_conditions(device: dict[str, Any], path: str) -> list[FieldError]:
    conditions = device.get("bindingConditions") or []
    failures = device.get("bindingFailureConditions") or []
    errors: list[FieldError] = []
    for field, items in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        if len(items) > 4:
            errors.append(FieldError.too_many(f"{path}.{field}", len(items), 4))
    if bool(conditions) != bool(failures):
        detail = "bindingConditions and bindingFailureConditions must be set together"
        errors.append(FieldError.invalid(f"{path}.bindingConditions", len(conditions), detail))
    for overlap in sorted(set(conditions) & set(failures)):
        errors.append(FieldError.duplicate(f"{path}.bindingFailureConditions", overlap))
    return errors


def _shared_counters(spec: dict[str, Any], minor: int) -> list[FieldError]:
    sets = spec.get("sharedCounters") or []
    errors: list[FieldError] = []
    if minor >= 35:
        if len(sets) > 8:
            errors.append(FieldError.too_many("spec.sharedCounters", len(sets), 8))
        if sets and spec.get("devices"):
            detail = "only one of `sharedCounters` or `devices` is allowed"
            errors.append(FieldError.invalid("spec", "{sharedCounters, devices}", detail))
    total = sum(len((s or {}).get("counters") or {}) for s in sets)
    if minor == 34 and total > 32:
        errors.append(FieldError.too_many("spec.sharedCounters", total, 32))
    seen: set[str] = set()
    for i, counter_set in enumerate(sets):
        path = f"spec.sharedCounters[{i}]"
        name = (counter_set or {}).get("name") or ""
        if name in seen:
            errors.append(FieldError.duplicate(f"{path}.name", name))
        seen.add(name)
        errors += naming.dns_label(f"{path}.name", name)
        counters = (counter_set or {}).get("counters") or {}
        if minor >= 35 and len(counters) > 32:
            errors.append(FieldError.too_many(f"{path}.counters", len(counters), 32))
        errors += _counters(counters, f"{path}.counters")
    return errors


def _immutable_slice_fields(spec: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    pairs = (
        ("spec.driver", spec.get("driver"), old.get("driver")),
        ("spec.nodeName", spec.get("nodeName"), old.get("nodeName")),
        (
            "spec.pool.name",
            (spec.get("pool") or {}).get("name"),
            (old.get("pool") or {}).get("name"),
        ),
    )
    for path, new, before in pairs:
        if new != before:
            errors.append(FieldError.invalid(path, new, "field is immutable"))
    return errors


def validate_taint_rule(
    obj: dict[str, Any], old: dict[str, Any] | None, minor: int
) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors = validate_taint(spec.get("taint") or {}, "spec.taint", minor)
    selector = spec.get("deviceSelector")
    if selector is not None:
        path = "spec.deviceSelector"
        if selector.get("driver"):
            errors += naming.driver_name(f"{path}.driver", selector["driver"])
        if selector.get("pool"):
            errors += naming.pool_name(f"{path}.pool", selector["pool"])
        if selector.get("device"):
            errors += naming.dns_label(f"{path}.device", selector["device"])
        if selector.get("deviceClassName"):
            errors += naming.dns_subdomain(f"{path}.deviceClassName", selector["deviceClassName"])
    conditions = (obj.get("status") or {}).get("conditions") or []
    if len(conditions) > 8:
        errors.append(FieldError.too_many("status.conditions", len(conditions), 8))
    return errors
