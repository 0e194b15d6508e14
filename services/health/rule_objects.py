"""DeviceTaintRule objects (pure): names, labels, bodies and what an object expresses.

One rule per (driver, node, device, taint key), with a deterministic DNS name and labels
that let the node's agent find its rules again after a restart. A rule may carry a note (the
reason of a manual drain) in the `dra-suite.io/reason` annotation.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.health.policy import Taint, label_value
from shared.kube.resources import RESOURCE_GROUP

__all__ = [
    "ANNOTATION_REASON",
    "LABEL_DEVICE",
    "LABEL_DRIVER",
    "LABEL_NODE",
    "VERSIONS",
    "RuleSpec",
    "rule_body",
    "rule_labels",
    "rule_name",
    "rule_selector",
    "spec_of",
    "up_to_date",
]

# Preferred first; only versions that serve `devicetaintrules` count.
VERSIONS = ("v1", "v1beta2", "v1alpha3")
LABEL_DRIVER = "dra-suite.io/driver"
LABEL_NODE = "dra-suite.io/node"
LABEL_DEVICE = "dra-suite.io/device"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "dra-suite-health"
ANNOTATION_REASON = "dra-suite.io/reason"
_NAME_MAX = 253
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleSpec:
    """One DeviceTaintRule as we want it (or as we found it)."""

    name: str
    driver: str
    node: str
    pool: str
    device: str
    taint: Taint
    note: str = ""
    """Free text kept in an annotation (a drain's reason)."""


def _digest(*parts: str, size: int = 10) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:size]


def _dns(text: str) -> str:
    """`text` as dot-separated DNS labels (lower case, [a-z0-9-], alphanumeric ends)."""
    labels = (_NOT_DNS.sub("-", part.lower()).strip("-") for part in text.split("."))
    return ".".join(label for label in labels if label)


def rule_name(*, driver: str, node: str, device: str, key: str) -> str:
    """`<node>.<device>.<cause>-<hash>`: deterministic, unique per key, a DNS subdomain."""
    digest = _digest(driver, node, device, key)
    base = ".".join(p for p in (_dns(node), _dns(device), _dns(key.rpartition("/")[2])) if p)
    base = base[: _NAME_MAX - len(digest) - 1].rstrip(".-")
    return f"{base}-{digest}" if base else digest


def _label(text: str) -> str:
    """`text` as a label value; long or odd values keep a hash so they stay distinct."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    return f"{label_value(text[:50])}-{_digest(text, size=12)}".lstrip("-")


def rule_labels(*, driver: str, node: str, device: str) -> dict[str, str]:
    return {
        LABEL_MANAGED_BY: MANAGER,
        LABEL_DRIVER: _label(driver),
        LABEL_NODE: _label(node),
        LABEL_DEVICE: _label(device),
    }


def rule_selector(*, driver: str, node: str) -> str:
    """Label selector of the rules this node's agent owns."""
    return f"{LABEL_DRIVER}={_label(driver)},{LABEL_NODE}={_label(node)}"


def rule_body(spec: RuleSpec, *, version: str, time_added: str = "") -> dict[str, Any]:
    taint: dict[str, str] = {"key": spec.taint.key, "effect": spec.taint.effect}
    if spec.taint.value:
        taint["value"] = spec.taint.value
    if time_added:
        taint["timeAdded"] = time_added
    metadata: dict[str, Any] = {
        "name": spec.name,
        "labels": rule_labels(driver=spec.driver, node=spec.node, device=spec.device),
    }
    if spec.note:
        metadata["annotations"] = {ANNOTATION_REASON: spec.note}
    return {
        "apiVersion": f"{RESOURCE_GROUP}/{version}",
        "kind": "DeviceTaintRule",
        "metadata": metadata,
        "spec": {
            "deviceSelector": {"driver": spec.driver, "pool": spec.pool, "device": spec.device},
            "taint": taint,
        },
    }


def spec_of(obj: Mapping[str, Any], *, node: str) -> RuleSpec:
    """The RuleSpec an API object expresses (missing fields read as empty)."""
    spec = obj.get("spec") or {}
    selector = spec.get("deviceSelector") or {}
    taint = spec.get("taint") or {}
    metadata = obj.get("metadata") or {}
    return RuleSpec(
        name=str(metadata.get("name", "")),
        driver=str(selector.get("driver", "")),
        node=node,
        pool=str(selector.get("pool", "")),
        device=str(selector.get("device", "")),
        taint=Taint(
            key=str(taint.get("key", "")),
            value=str(taint.get("value", "")),
            effect=str(taint.get("effect", "")),
        ),
        note=str((metadata.get("annotations") or {}).get(ANNOTATION_REASON, "")),
    )


def up_to_date(obj: Mapping[str, Any], spec: RuleSpec) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    wanted = rule_labels(driver=spec.driver, node=spec.node, device=spec.device)
    return spec_of(obj, node=spec.node) == spec and all(
        labels.get(k) == v for k, v in wanted.items()
    )
