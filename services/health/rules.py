"""Fault rules: which class a fault belongs to and what its class does (pure).

A fault is `fatal`, `transient` or `informational`, looked up by (cause, code), then by
cause, then the default class; codes on a cause's ignore list are no fault at all. The built-in
classes and ignore lists are every vendor's own (`Vendor.faults`: for example NVIDIA's
application XIDs, Ascend's restart levels), gathered from the registry. Each class has a taint
effect and says whether the device counts as unhealthy. The rules also say what an Ascend
error code missing from the built-in table does (`isolate` or `ignore`, applied by the ascend
monitor). `from_mapping()` reads the policy file's document (already parsed YAML); invalid
documents raise ConfigError.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from shared.errors import ConfigError
from shared.vendors import registry

__all__ = [
    "EFFECTS",
    "UNKNOWN_CODE_ACTIONS",
    "ClassRule",
    "FaultClass",
    "FaultRules",
    "classify",
    "default_rules",
    "from_mapping",
    "ignoring",
]

EFFECTS = ("NoSchedule", "NoExecute", "None")
"""XIDs NVIDIA's plugins treat as application errors: the GPU stays healthy."""
UNKNOWN_CODE_ACTIONS = ("isolate", "ignore")
"""What an Ascend error code missing from the built-in table does."""


class FaultClass(enum.Enum):
    FATAL = "fatal"
    """The device is broken until the monitor sees it healthy for the recovery hold."""
    TRANSIENT = "transient"
    """Expected to pass (e.g. a contained ECC error); tainted while it lasts."""
    INFORMATIONAL = "informational"
    """Worth a record and an alert; the device stays healthy (effect None by default)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassRule:
    effect: str
    """Taint effect: NoSchedule, NoExecute (evicts) or None (informational, API 1.35+)."""
    unhealthy: bool = True
    """Whether the device is UNHEALTHY (to the kubelet and the records) while it lasts."""


def _frozen(data: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(data))


_DEFAULT_CLASSES = {
    FaultClass.FATAL: ClassRule(effect="NoSchedule"),
    FaultClass.TRANSIENT: ClassRule(effect="NoSchedule"),
    FaultClass.INFORMATIONAL: ClassRule(effect="None", unhealthy=False),
}
_DEFAULT_CAUSES = {
    cause: FaultClass(name)
    for vendor in registry.BACKENDS.values()
    for cause, name in vendor.faults.causes.items()
}
_DEFAULT_CODES = {
    code: FaultClass(name)
    for vendor in registry.BACKENDS.values()
    for code, name in vendor.faults.codes.items()
}


def _vendors_ignore() -> dict[str, frozenset[str]]:
    ignored: dict[str, frozenset[str]] = {}
    for vendor in registry.BACKENDS.values():
        for cause, codes in vendor.faults.ignore.items():
            ignored[cause] = ignored.get(cause, frozenset()) | codes
    return ignored


_DEFAULT_IGNORE = _vendors_ignore()


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultRules:
    classes: Mapping[FaultClass, ClassRule] = field(
        default_factory=lambda: _frozen(_DEFAULT_CLASSES)
    )
    causes: Mapping[str, FaultClass] = field(default_factory=lambda: _frozen(_DEFAULT_CAUSES))
    """Class by cause, e.g. {"ecc": TRANSIENT}."""
    codes: Mapping[tuple[str, str], FaultClass] = field(
        default_factory=lambda: _frozen(_DEFAULT_CODES)
    )
    """Class by (cause, code); wins over `causes`."""
    ignore: Mapping[str, frozenset[str]] = field(default_factory=lambda: _frozen(_DEFAULT_IGNORE))
    """Codes per cause that are no fault at all."""
    default: FaultClass = FaultClass.FATAL
    """Class of a cause and code listed nowhere."""
    ascend_unknown_codes: str = "isolate"
    """`isolate`: an unknown npu-smi error code is a fatal `npu` fault; `ignore`: no fault."""

    def rule(self, fault_class: FaultClass) -> ClassRule:
        return self.classes.get(fault_class) or _DEFAULT_CLASSES[fault_class]


def default_rules(
    *, effect: str = "NoSchedule", ascend_unknown_codes: str = "isolate"
) -> FaultRules:
    """The built-in rules, with `effect` for the fatal and transient classes."""
    classes = dict(_DEFAULT_CLASSES)
    for name in (FaultClass.FATAL, FaultClass.TRANSIENT):
        classes[name] = ClassRule(effect=effect)
    return FaultRules(classes=_frozen(classes), ascend_unknown_codes=ascend_unknown_codes)


def ignoring(rules: FaultRules, cause: str, codes: Iterable[str]) -> FaultRules:
    """`rules` with `codes` added to `cause`'s ignore list."""
    extra = frozenset(codes)
    if not extra:
        return rules
    ignore = dict(rules.ignore)
    ignore[cause] = ignore.get(cause, frozenset()) | extra
    return replace(rules, ignore=_frozen(ignore))


def classify(*, cause: str, code: str, rules: FaultRules) -> FaultClass | None:
    """The class of a fault with `cause` and `code`; None when it is ignored."""
    if code in rules.ignore.get(cause, frozenset()):
        return None
    found = rules.codes.get((cause, code)) or rules.causes.get(cause)
    return found or rules.default


def _class(value: object, where: str) -> FaultClass:
    try:
        return FaultClass(str(value))
    except ValueError:
        names = ", ".join(c.value for c in FaultClass)
        raise ConfigError(f"{where}: {value!r} is not one of {names}", field="policy") from None


def _mapping(data: object, where: str) -> Mapping[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}", field="policy")
    return {str(k): v for k, v in data.items()}


def _class_rules(data: object, base: FaultRules) -> dict[FaultClass, ClassRule]:
    classes = dict(base.classes)
    for name, spec in _mapping(data, "classes").items():
        fault_class = _class(name, "classes")
        fields = _mapping(spec, f"classes.{name}")
        unknown = set(fields) - {"effect", "unhealthy"}
        if unknown:
            raise ConfigError(f"classes.{name}: unknown keys {sorted(unknown)}", field="policy")
        old = base.rule(fault_class)
        effect = str(fields.get("effect", old.effect))
        if effect not in EFFECTS:
            raise ConfigError(
                f"classes.{name}.effect: {effect!r} is not one of {', '.join(EFFECTS)}",
                field="policy",
            )
        unhealthy = fields.get("unhealthy", old.unhealthy)
        if not isinstance(unhealthy, bool):
            raise ConfigError(f"classes.{name}.unhealthy: expected true or false", field="policy")
        classes[fault_class] = ClassRule(effect=effect, unhealthy=unhealthy)
    return classes


def _codes(data: object) -> dict[tuple[str, str], FaultClass]:
    codes: dict[tuple[str, str], FaultClass] = {}
    for cause, by_code in _mapping(data, "codes").items():
        for code, name in _mapping(by_code, f"codes.{cause}").items():
            codes[(cause, code)] = _class(name, f"codes.{cause}.{code}")
    return codes


def _ignore(data: object) -> dict[str, frozenset[str]]:
    ignore: dict[str, frozenset[str]] = {}
    for cause, codes in _mapping(data, "ignore").items():
        if not isinstance(codes, list):
            raise ConfigError(f"ignore.{cause}: expected a list of codes", field="policy")
        ignore[cause] = frozenset(str(code) for code in codes)
    return ignore


_UNKNOWN_KEY = "ascend_unknown_codes"


def from_mapping(data: object, *, base: FaultRules) -> FaultRules:
    """Rules from a policy document; what it leaves out keeps `base`'s value.

    `classes` and `codes` merge into `base`; `causes` too; a cause listed under `ignore`
    replaces that cause's ignore list (`ignore: {xid: []}` turns the XID list off);
    `ascend_unknown_codes` (isolate or ignore) replaces the flag's value.
    """
    document = _mapping(data, "policy file")
    unknown = set(document) - {"classes", "causes", "codes", "ignore", "default", _UNKNOWN_KEY}
    if unknown:
        raise ConfigError(f"policy file: unknown keys {sorted(unknown)}", field="policy")
    unknown_codes = str(document.get(_UNKNOWN_KEY, base.ascend_unknown_codes))
    if unknown_codes not in UNKNOWN_CODE_ACTIONS:
        raise ConfigError(
            f"{_UNKNOWN_KEY}: {unknown_codes!r} is not one of {', '.join(UNKNOWN_CODE_ACTIONS)}",
            field="policy",
        )
    causes = {
        cause: _class(name, f"causes.{cause}")
        for cause, name in _mapping(document.get("causes"), "causes").items()
    }
    default = document.get("default")
    return FaultRules(
        classes=_frozen(_class_rules(document.get("classes"), base)),
        causes=_frozen({**base.causes, **causes}),
        codes=_frozen({**base.codes, **_codes(document.get("codes"))}),
        ignore=_frozen({**base.ignore, **_ignore(document.get("ignore"))}),
        default=base.default if default is None else _class(default, "default"),
        ascend_unknown_codes=unknown_codes,
    )
