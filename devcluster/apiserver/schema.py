"""Structural validation against the published Kubernetes JSON schemas (kubernetes-validate).

The strict schemas for the emulated version are compiled once into closures (generic
jsonschema takes ~50 ms for a 128-device slice; this ~1 ms). Only the keywords those
schemas use are supported. Validation also canonicalizes metav1.Time values, as Go would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

from devcluster.apiserver.errors import FieldError
from devcluster.extra import MissingExtraError

__all__ = ["SchemaSet", "schema_set"]

Check = Callable[[Any, str, list[FieldError]], None]

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}
_TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.Time"
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class SchemaSet:
    """Compiled validators for every kind in one Kubernetes version's strict schemas."""

    def __init__(self, definitions: dict[str, Any]) -> None:
        self._defs = definitions
        self._compiled: dict[str, Check] = {}
        self._by_gvk: dict[tuple[str, str], str] = {}
        for name, node in definitions.items():
            for gvk in node.get("x-kubernetes-group-version-kind", ()):
                group, version = gvk["group"], gvk["version"]
                api_version = f"{group}/{version}" if group else version
                self._by_gvk[(api_version, gvk["kind"])] = name

    def validate(self, obj: dict[str, Any]) -> list[FieldError]:
        """Errors for `obj` (keyed by its apiVersion/kind); unknown kinds are not checked."""
        name = self._by_gvk.get((obj.get("apiVersion", ""), obj.get("kind", "")))
        if name is None:
            return []
        errors: list[FieldError] = []
        self._ref(name)(obj, "", errors)
        return errors

    def _ref(self, name: str) -> Check:
        check = self._compiled.get(name)
        if check is None:
            check = self._compiled[name] = self._compile(self._defs[name])
        return check

    def _compile(self, node: dict[str, Any]) -> Check:
        ref = node.get("$ref")
        if ref is not None:
            return self._lazy(ref.rsplit("/", 1)[-1])
        if "oneOf" in node:
            return self._one_of([self._compile(n) for n in node["oneOf"]])
        types = node.get("type")
        names = [types] if isinstance(types, str) else list(types or [])
        nullable = "null" in names
        py_types = tuple(t for n in names if n != "null" for t in _PY_TYPES[n])
        inner = self._inner(node, names)
        enum = node.get("enum")
        type_msg = " or ".join(n for n in names if n != "null")

        def check(value: Any, path: str, errors: list[FieldError]) -> None:
            if value is None:
                if not nullable and py_types:
                    errors.append(FieldError.required(path))
                return
            if py_types and (
                not isinstance(value, py_types)
                or (isinstance(value, bool) and bool not in py_types)
            ):
                errors.append(FieldError.type_invalid(path, value, f"must be of type {type_msg}"))
                return
            if enum is not None and value not in enum:
                errors.append(FieldError.not_supported(path, value, [str(x) for x in enum]))
                return
            if inner is not None:
                inner(value, path, errors)

        return check

    def _lazy(self, name: str) -> Check:
        # Resolved at first use, so recursive definitions (JSONSchemaProps) compile.
        target: Check | None = None

        def check(value: Any, path: str, errors: list[FieldError]) -> None:
            nonlocal target
            if target is None:
                target = self._ref(name)
            target(value, path, errors)

        return check

    def _inner(self, node: dict[str, Any], names: list[str]) -> Check | None:
        if "object" in names or "properties" in node:
            return self._object(node)
        if "array" in names and "items" in node:
            return self._array(self._compile(node["items"]))
        limits = _INT_RANGES.get(node.get("format", ""))
        if "integer" in names and limits is not None:
            low, high = limits

            def int_range(value: Any, path: str, errors: list[FieldError]) -> None:
                if not low <= value <= high:
                    errors.append(FieldError.invalid(path, value, "integer out of range"))

            return int_range
        return None

    def _object(self, node: dict[str, Any]) -> Check:
        props = {k: self._compile(v) for k, v in node.get("properties", {}).items()}
        # Plain string/boolean leaves are checked inline: most fields of a big object are.
        leaves = {k: t for k, v in node.get("properties", {}).items() if (t := _leaf_type(v))}
        times = [
            k for k, v in node.get("properties", {}).items() if v.get("$ref", "").endswith(_TIME)
        ]
        required = tuple(node.get("required", ()))
        extra = node.get("additionalProperties", True)
        extra_check = self._compile(extra) if isinstance(extra, dict) else None
        closed = extra is False

        def check(value: dict[str, Any], path: str, errors: list[FieldError]) -> None:
            for key in times:
                if isinstance(value.get(key), str):
                    _canonical_time(value, key, _child(path, key), errors)
            for key in required:
                if key not in value:
                    errors.append(FieldError.required(_child(path, key)))
            for key, item in value.items():
                if type(item) is leaves.get(key):
                    continue
                prop = props.get(key)
                if prop is not None:
                    prop(item, _child(path, key), errors)
                elif extra_check is not None:
                    extra_check(item, f"{path}[{key}]", errors)
                elif closed:
                    field = _child(path, key)
                    errors.append(
                        FieldError("FieldValueInvalid", field, f'unknown field "{field}"')
                    )

        return check

    @staticmethod
    def _array(item_check: Check) -> Check:
        def check(value: list[Any], path: str, errors: list[FieldError]) -> None:
            for i, item in enumerate(value):
                item_check(item, f"{path}[{i}]", errors)

        return check

    @staticmethod
    def _one_of(options: list[Check]) -> Check:
        def check(value: Any, path: str, errors: list[FieldError]) -> None:
            for option in options:
                attempt: list[FieldError] = []
                option(value, path, attempt)
                if not attempt:
                    return
            errors.append(FieldError.type_invalid(path, value, "does not match any allowed type"))

        return check


def _canonical_time(obj: dict[str, Any], key: str, path: str, errors: list[FieldError]) -> None:
    """metav1.Time is stored as RFC 3339 UTC seconds ("...Z"), whatever offset was sent."""
    try:
        parsed = datetime.fromisoformat(obj[key])
    except ValueError:
        errors.append(FieldError.invalid(path, obj[key], "must be an RFC 3339 date-time"))
        return
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    obj[key] = parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _leaf_type(node: dict[str, Any]) -> type | None:
    if set(node) - {"type", "description"}:
        return None
    names = set([node["type"]] if isinstance(node.get("type"), str) else node.get("type") or [])
    names.discard("null")
    if names == {"string"}:
        return str
    return bool if names == {"boolean"} else None


@cache
def schema_set(kubernetes_version: str) -> SchemaSet:
    """The compiled strict schemas for "1.34"/"1.35"/"1.36" (loaded once per process)."""
    try:
        root = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    except ModuleNotFoundError as exc:
        raise MissingExtraError("kubernetes-validate", "the API emulator's schemas") from exc
    path = root / f"v{kubernetes_version}.0-local-strict" / "_definitions.json"
    return SchemaSet(json.loads(path.read_text())["$defs"])
