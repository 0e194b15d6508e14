"""Device taints and a request's tolerations, as kube-scheduler applies them (pure).

A device's taints are those published in its slice plus those of every DeviceTaintRule whose
`deviceSelector` (driver, pool, device; an unset field matches all; on 1.34's v1alpha3 also a
device class and CEL selectors, all of which must select the device) selects it. Only the
effects NoSchedule and NoExecute keep a device from being allocated (None is informational);
a taint is tolerated when one toleration matches it: same key (an empty key with `Exists`
matches every key), same effect (or none given), and `Exists`, or `Equal` (the default) with
the same value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from services.allocator.device import Device, DeviceKey

__all__ = ["TaintRules", "blocking_taint", "tolerates"]

Obj = dict[str, Any]
_BLOCKING = ("NoSchedule", "NoExecute")


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def blocking_taint(taints: Iterable[Mapping[str, Any]], tolerations: Sequence[Obj]) -> Obj | None:
    """The first taint that keeps the device from a request with `tolerations`, or None."""
    for taint in taints:
        if taint.get("effect") in _BLOCKING and not any(tolerates(t, taint) for t in tolerations):
            return dict(taint)
    return None


class TaintRules:
    """The taints DeviceTaintRules put on devices, looked up per device.

    `selects(expressions, device)`: whether every CEL expression selects the device (only
    needed for v1alpha3 rules with a device class or selectors); `classes` by name.
    """

    def __init__(
        self,
        rules: Iterable[Obj] = (),
        *,
        classes: Mapping[str, Obj] | None = None,
        selects: Callable[[Sequence[str], Device], bool] | None = None,
    ) -> None:
        self._exact: dict[DeviceKey, list[Obj]] = {}
        self._broad: list[tuple[Mapping[str, Any], Obj]] = []
        self._classes = classes or {}
        self._selects = selects
        for rule in rules:
            spec = rule.get("spec") or {}
            taint = dict(spec.get("taint") or {})
            if not taint:
                continue
            taint["rule"] = (rule.get("metadata") or {}).get("name", "")
            selector = spec.get("deviceSelector") or {}
            driver, pool, name = (selector.get(k) for k in ("driver", "pool", "device"))
            if driver and pool and name and not _by_cel(selector):
                self._exact.setdefault((driver, pool, name), []).append(taint)
            else:
                self._broad.append((selector, taint))

    def taints(self, device: Device) -> list[Obj]:
        """The device's published taints, then those of the rules that select it."""
        found = list(device.taints) + self._exact.get(device.key, [])
        for selector, taint in self._broad:
            if self._selected(selector, device):
                found.append(taint)
        return found

    def _selected(self, selector: Mapping[str, Any], device: Device) -> bool:
        for field, value in zip(("driver", "pool", "device"), device.key, strict=True):
            if selector.get(field) and selector[field] != value:
                return False
        if not _by_cel(selector):
            return True
        expressions = [
            ((s or {}).get("cel") or {}).get("expression", "")
            for s in selector.get("selectors") or ()
        ]
        if selector.get("deviceClassName"):
            device_class = self._classes.get(selector["deviceClassName"])
            if device_class is None:
                return False  # a rule for a class that does not exist selects nothing
            expressions += [
                ((s or {}).get("cel") or {}).get("expression", "")
                for s in (device_class.get("spec") or {}).get("selectors") or ()
            ]
        return self._selects is not None and self._selects(expressions, device)


def _by_cel(selector: Mapping[str, Any]) -> bool:
    return bool(selector.get("deviceClassName") or selector.get("selectors"))
