"""Everything a written object must pass: typemeta, metadata names, JSON schema, DRA rules.

`check(rt, obj, old)` raises a 422 `APIError` listing every field error (schema
errors first, then semantic ones, as kube reports decode before validation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from devcluster.apiserver import claim_rules, dra_rules, naming
from devcluster.apiserver.config import ClusterConfig
from devcluster.apiserver.errors import FieldError, bad_request, invalid
from devcluster.apiserver.registry import ResourceType
from devcluster.apiserver.schema import schema_set

__all__ = ["Validator"]

Rule = Callable[[dict[str, Any], dict[str, Any] | None, int], list[FieldError]]
_RULES: dict[str, Rule] = {
    "resource.k8s.io/resourceslices": dra_rules.validate_slice,
    "resource.k8s.io/devicetaintrules": dra_rules.validate_taint_rule,
    "resource.k8s.io/resourceclaims": claim_rules.validate_claim,
    "resource.k8s.io/resourceclaimtemplates": claim_rules.validate_claim_template,
    "resource.k8s.io/deviceclasses": claim_rules.validate_device_class,
}


class Validator:
    def __init__(self, config: ClusterConfig) -> None:
        self._minor = config.minor
        self._schemas = schema_set(config.kubernetes_version)

    @staticmethod
    def typemeta(rt: ResourceType, obj: Any) -> dict[str, Any]:
        """Check the decoded body is an object of `rt`'s kind, filling in missing typemeta."""
        if not isinstance(obj, dict):
            raise bad_request(
                f"the body of the request must be a JSON object, got {type(obj).__name__}"
            )
        api_version, kind = (
            obj.setdefault("apiVersion", rt.api_version),
            obj.setdefault("kind", rt.kind),
        )
        if kind != rt.kind:
            raise bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )
        if api_version != rt.api_version:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match "
                f"the expected API version ({rt.api_version})"
            )
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be a JSON object")
        return meta

    def schema(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        errors = self._schemas.validate(obj)
        if errors:
            raise invalid(rt.kind, rt.group, _name(obj), errors)

    def semantics(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        *,
        first: list[FieldError] | None = None,
    ) -> None:
        """Raise one 422 with every rule's errors; `first` (admission's) lead the list."""
        errors = [*(first or []), *_metadata(rt, obj.get("metadata") or {})]
        rule = _RULES.get(rt.storage)
        if rule is not None:
            errors += rule(obj, old, self._minor)
        if errors:
            raise invalid(rt.kind, rt.group, _name(obj), errors)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _metadata(rt: ResourceType, meta: dict[str, Any]) -> list[FieldError]:
    name = meta.get("name") or ""
    if rt.storage == "namespaces":
        errors = naming.dns_label("metadata.name", name)
    else:
        errors = naming.dns_subdomain("metadata.name", name)
    if rt.namespaced:
        errors += naming.dns_label("metadata.namespace", meta.get("namespace") or "")
    for key, value in (meta.get("labels") or {}).items():
        errors += naming.label_name("metadata.labels", key)
        errors += naming.label_value(f"metadata.labels[{key}]", value or "")
    for key in meta.get("annotations") or {}:
        errors += naming.label_name("metadata.annotations", key.lower())
    return errors
