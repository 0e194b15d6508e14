"""DeviceClasses generated from the devices the fleet publishes (pure): `dractl classes generate`.

Every published device falls in exactly one generated class, keyed on the attributes the
backends publish in the driver's domain (docs/usage.md, "Device backends and attributes"):

- a whole device: one class per `type` and model (`productName`, else `chipName`), named
  `<model>.<type>.<driver>` (`nvidia-h100-80gb-hbm3.gpu.sim.dra-suite.io`, `910b4.npu.sim...`);
- a published partition: one class per profile, whatever the model: a MIG placement (`profile`)
  `<type>-<profile>.<driver>` (`mig-1g.10gb.gpu.dra-suite.io`), a static vNPU (`vnpuTemplate`)
  `<template>.<type>.<driver>` (`vir02.npu.huawei.com`);
- a device several allocations share (`allowMultipleAllocations`, consumable capacity): the
  class of its kind with `shared.` in front, its twin for exclusive devices then selecting
  `!device.allowMultipleAllocations`. The CEL field exists from Kubernetes 1.36
  (DRAConsumableCapacity on); before, shared devices count as exclusive, with a note.

The `<type>` label is left out where the driver's first label says it (`910b4.npu.huawei.com`),
so the names of published partitions are those of the shipped overlays. Selectors are the
overlays' form, `device.driver == "<driver>" && device.attributes["<driver>"].type == "<type>"
&& ... .<attribute> == "<value>"`, with the class's attribute guarded by `has()` (a missing
attribute is a CEL runtime error, which fails a claim), and `!has(...)` for the attribute of a
class that comes first, so that a model class never hands out a partition.

No class carries `spec.config`: a published partition is defined by its device, and a shared
device needs no parameters. `spec.extendedResourceName` (KEP-5004, on from 1.36) is
`<driver>/<type>-<model>`, `<driver>/<type>-<profile>` or `<driver>/<template>`
(`shared-` in front for shared devices). The annotation `dra-suite.io/device-plugin-resource`
names the resource the allocation agent's device-plugin front offers the class's devices as
(`services.allocation.deviceplugin.resources`, without configured overrides), for moving pod
specs between the two fronts; it needs the backend of the driver's nodes (`BACKENDS`, or
`backends`), which slices do not say. Names are DNS subdomains, the same for the same fleet:
classes are sorted by name, a label longer than 63 characters or two values that give one name
get a hash of the value.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.allocation.deviceplugin import resources as deviceplugin
from services.allocation.resource_names import RESOURCE_NAME
from services.allocator.device import Device
from services.dractl.classgen_backends import BACKENDS
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = [
    "ANNOTATION_DEVICE_PLUGIN",
    "BACKENDS",
    "MODEL_ATTRIBUTES",
    "PARTITION_ATTRIBUTES",
    "Generated",
    "extended_resources",
    "generate",
]

Obj = dict[str, Any]

PARTITION_ATTRIBUTES = ("profile", "vnpuTemplate")
"""What makes a device a partition, in the order they are looked for (MIG, then vNPU)."""
MODEL_ATTRIBUTES = ("productName", "chipName")
"""What names a whole device's model (nvml and the sim's GPUs, then Ascend and the sim's NPUs)."""
ANNOTATION_DEVICE_PLUGIN = "dra-suite.io/device-plugin-resource"
LABELS = {"app.kubernetes.io/part-of": "dra-suite", "app.kubernetes.io/managed-by": "dractl"}
EXTENDED_RESOURCE_MINOR = 36
"""DRAExtendedResource and DRAConsumableCapacity: beta and on from 1.36 (alpha, off, before)."""

_AXES = (*PARTITION_ATTRIBUTES, *MODEL_ATTRIBUTES)
_NO_MODEL = "unknown-model"
_LABEL_MAX = 63
_NAME_MAX = 253
_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True, order=True)
class _Key:
    """What puts a device in a class."""

    driver: str
    type: str
    axis: str
    """The attribute the class tells its devices by ("" for a whole device without a model)."""
    value: str
    shared: bool

    @property
    def group(self) -> tuple[str, str, str, str]:
        return (self.driver, self.type, self.axis, self.value)


@dataclass(frozen=True, slots=True)
class Generated:
    classes: tuple[Obj, ...]
    """DeviceClass objects (resource.k8s.io/v1), sorted by name."""
    selected: Mapping[str, tuple[str, ...]]
    """Class name -> the `driver/pool/device` IDs of the devices it was made for."""
    notes: tuple[str, ...] = ()
    """What the caller should tell the user (devices left out, features the version lacks)."""


@dataclass(slots=True)
class _Class:
    key: _Key
    devices: list[Device] = field(default_factory=list)
    name: str = ""
    resource: str = ""


def generate(
    devices: Iterable[Device],
    *,
    minor: int,
    backends: Mapping[str, str] | None = None,
) -> Generated:
    """The classes for `devices` (every driver's), for a cluster of Kubernetes 1.`minor`;
    `backends` (driver -> sim|nvml|ascend) adds to and overrides `BACKENDS`."""
    sharing = minor >= EXTENDED_RESOURCE_MINOR
    notes: list[str] = []
    untyped: list[Device] = []
    shared_ignored: list[str] = []
    found: dict[_Key, _Class] = {}
    for device in devices:
        key = _key(device, sharing=sharing)
        if key is None:
            untyped.append(device)
            continue
        if device.multiple_allocations and not sharing:
            shared_ignored.append(_device_id(device))
        found.setdefault(key, _Class(key)).devices.append(device)
    if untyped:
        notes.append(
            f"{len(untyped)} devices publish no string attribute `type` in their driver's "
            f"domain and are in no class: {_listing([_device_id(d) for d in untyped])}"
        )
    if shared_ignored:
        notes.append(
            f"{len(shared_ignored)} devices allow multiple allocations, which Kubernetes "
            f"1.{minor} cannot select on (DRAConsumableCapacity is off before 1.36): they are "
            f"in the classes of exclusive devices: {_listing(shared_ignored)}"
        )
    classes = sorted(found.values(), key=lambda c: c.key)
    _name(classes)
    known = {**BACKENDS, **(backends or {})}
    shared_groups = {c.key.group for c in classes if c.key.shared}
    carried = _carried(classes)
    objects = [
        _device_class(
            c,
            selectors=_selector(
                c.key,
                shared_groups=shared_groups,
                carried=carried,
                untyped={d.driver for d in untyped},
            ),
            resource=c.resource if minor >= EXTENDED_RESOURCE_MINOR else "",
            plugin=_plugin_resources(c, backend=known.get(c.key.driver)),
        )
        for c in classes
    ]
    objects.sort(key=lambda o: str(o["metadata"]["name"]))
    selected = {c.name: tuple(sorted(_device_id(d) for d in c.devices)) for c in classes}
    return Generated(classes=tuple(objects), selected=selected, notes=tuple(notes))


def extended_resources(classes: Sequence[Obj]) -> dict[str, str]:
    """Class name -> its extended resource name, for the classes that have one."""
    return {
        c["metadata"]["name"]: c["spec"]["extendedResourceName"]
        for c in classes
        if c["spec"].get("extendedResourceName")
    }


def _string(device: Device, attribute: str) -> str | None:
    """The value of a string attribute of the driver's domain; None when the device has none
    (classes key on string attributes only)."""
    typed = device.typed_attribute(f"{device.driver}/{attribute}")
    if typed is None or typed[0] != "string" or not isinstance(typed[1], str):
        return None
    return typed[1]


def _key(device: Device, *, sharing: bool) -> _Key | None:
    kind = _string(device, "type")
    if kind is None:
        return None
    shared = sharing and device.multiple_allocations
    for axis in _AXES:
        value = _string(device, axis)
        if value is not None:
            return _Key(device.driver, kind, axis, value, shared)
    return _Key(device.driver, kind, "", "", shared)


def _carried(classes: Sequence[_Class]) -> dict[tuple[str, str], set[str]]:
    """(driver, type) -> the class attributes some of its devices carry."""
    carried: dict[tuple[str, str], set[str]] = defaultdict(set)
    for c in classes:
        for device in c.devices:
            carried[(c.key.driver, c.key.type)].update(
                axis for axis in _AXES if _string(device, axis) is not None
            )
    return carried


def _selector(
    key: _Key,
    *,
    shared_groups: set[tuple[str, str, str, str]],
    carried: Mapping[tuple[str, str], set[str]],
    untyped: set[str],
) -> str:
    """The class's CEL: its driver, type and attribute, never an attribute that puts a device
    in a class before it (`_AXES` order), and the sharing term where the kind has both.

    A missing attribute is a CEL runtime error, which fails the claim (not the device) in
    kube-scheduler, and `&&` yields false over an error only where the other side is false: so
    the class's attribute is guarded with `has()` (a whole chip has no `vnpuTemplate`), and
    `type` too for a driver some of whose devices publish none."""
    domain = f"device.attributes[{_quote(key.driver)}]"
    terms = [f"device.driver == {_quote(key.driver)}"]
    if key.driver in untyped:
        terms.append(f"has({domain}.type)")
    terms.append(f"{domain}.type == {_quote(key.type)}")
    earlier = _AXES[: _AXES.index(key.axis)] if key.axis else _AXES
    present = carried.get((key.driver, key.type), set())
    terms += [f"!has({domain}.{axis})" for axis in earlier if axis in present]
    if key.axis:
        terms += [f"has({domain}.{key.axis})", f"{domain}.{key.axis} == {_quote(key.value)}"]
    if key.shared:
        terms.append("device.allowMultipleAllocations")
    elif key.group in shared_groups:
        terms.append("!device.allowMultipleAllocations")
    return " && ".join(terms)


def _quote(text: str) -> str:
    """A CEL string literal (CEL takes JSON's escapes)."""
    return json.dumps(text)


def _labels(key: _Key) -> list[str]:
    """The class name's labels before the driver's."""
    kind = _slug(key.type)
    if key.axis == "profile":
        labels = [f"{kind}-{_slug(key.value)}"]
    elif key.axis:
        labels = [_slug(key.value), kind]
    else:
        labels = [_NO_MODEL, kind]
    if labels[-1] == kind and key.driver.split(".", 1)[0] == kind and len(labels) > 1:
        labels.pop()
    return ["shared", *labels] if key.shared else labels


def _resource(key: _Key) -> str:
    """The extended resource's name after `<driver>/`."""
    if key.axis == "vnpuTemplate":
        name = key.value
    elif key.axis == "profile":
        name = f"{key.type}-{key.value}"
    else:
        name = f"{key.type}-{_slug(key.value) if key.axis else _NO_MODEL}"
    if not _RESOURCE_NAME.match(name):
        name = _slug(name).replace(".", "-")
    name = f"shared-{name}" if key.shared else name
    if len(name) > _LABEL_MAX:
        name = f"{name[: _LABEL_MAX - 9].rstrip('-._')}-{_hash(key, 8)}"
    return name


def _name(classes: Sequence[_Class]) -> None:
    """Set each class's name and extended resource, unique and deterministic: values that
    give one name (`a+b`, `a-b`) each get a hash of their key."""
    by_name: dict[str, list[_Class]] = defaultdict(list)
    by_resource: dict[str, list[_Class]] = defaultdict(list)
    for c in classes:
        labels = [_fit(label, c.key) for label in _labels(c.key)]
        c.name = ".".join([*labels, c.key.driver])
        if len(c.name) > _NAME_MAX:
            c.name = f"{_hash(c.key, 16)}.{c.key.driver}"
        by_name[c.name].append(c)
        c.resource = f"{c.key.driver}/{_resource(c.key)}"
        by_resource[c.resource].append(c)
    for same in by_name.values():
        if len(same) > 1:
            for c in same:
                first, _, rest = c.name.partition(".")
                c.name = f"{first[: _LABEL_MAX - 9]}-{_hash(c.key, 8)}.{rest}"
    for same in by_resource.values():
        if len(same) > 1:
            for c in same:
                driver, _, name = c.resource.partition("/")
                c.resource = f"{driver}/{name[: _LABEL_MAX - 9]}-{_hash(c.key, 8)}"


def _slug(text: str) -> str:
    """Lower case, runs of anything but letters, digits and dots as one `-`, no empty label."""
    slug = re.sub(r"[^a-z0-9.]+", "-", text.lower())
    labels = [label.strip("-") for label in slug.split(".")]
    return ".".join(label for label in labels if label) or "x"


def _fit(label: str, key: _Key) -> str:
    """`label` (maybe dotted) with every part of at most 63 characters."""
    return ".".join(
        part if len(part) <= _LABEL_MAX else f"{part[: _LABEL_MAX - 9].rstrip('-')}-{_hash(key, 8)}"
        for part in label.split(".")
    )


def _hash(key: _Key, length: int) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:length]


def _device_id(device: Device) -> str:
    return f"{device.driver}/{device.pool}/{device.name}"


def _listing(ids: Sequence[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def _device_class(c: _Class, *, selectors: str, resource: str, plugin: Sequence[str]) -> Obj:
    metadata: Obj = {"name": c.name, "labels": dict(LABELS)}
    if plugin:
        metadata["annotations"] = {ANNOTATION_DEVICE_PLUGIN: ",".join(plugin)}
    spec: Obj = {"selectors": [{"cel": {"expression": selectors}}]}
    if resource:
        spec["extendedResourceName"] = resource
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": metadata,
        "spec": spec,
    }


def _plugin_resources(c: _Class, *, backend: str | None) -> list[str]:
    """The device-plugin resources the class's devices are offered as (sorted; none when the
    driver's backend is unknown or the devices are not offered, as MIG placements made only
    on demand are not)."""
    if backend is None:
        return []
    names = {
        deviceplugin.resource_name(
            _inventory_device(device), backend=backend, driver=c.key.driver, overrides={}
        )
        for device in c.devices
    }
    return sorted(n for n in names if n is not None and RESOURCE_NAME.match(n))


def _inventory_device(device: Device) -> inventory_pb2.Device:
    """The published device as the discovery agent's inventory has it, as far as the slice
    tells: kind, UUID, attributes of the driver's domain, a parent for a partition."""
    prefix = f"{device.driver}/"
    kind = _string(device, "type") or ""
    proto = inventory_pb2.Device(name=device.name, kind=kind, uuid=_string(device, "uuid") or "")
    for qualified, value in device.attributes.items():
        if not qualified.startswith(prefix) or not isinstance(value, Mapping) or not value:
            continue
        (kind_of, raw), *_ = value.items()
        if kind_of in ("string", "version") and isinstance(raw, str):
            setattr(proto.attributes[qualified.removeprefix(prefix)], kind_of, raw)
        elif kind_of == "bool" and isinstance(raw, bool):
            proto.attributes[qualified.removeprefix(prefix)].bool = raw
        elif kind_of == "int" and isinstance(raw, int) and not isinstance(raw, bool):
            proto.attributes[qualified.removeprefix(prefix)].int = raw
    if any(_string(device, axis) is not None for axis in PARTITION_ATTRIBUTES):
        proto.parent = _string(device, "parentUUID") or "partition"
    return proto
