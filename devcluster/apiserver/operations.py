"""The write verbs (create, update, patch, delete) with kube-apiserver semantics.

Shared by the HTTP handlers and the in-process API, so both go through the same
validation. Returns store-owned objects: callers serialize or `clone()` them,
never mutate. Raises `APIError` for every failure.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import yaml

from devcluster.apiserver import admission, errors, strategy
from devcluster.apiserver.config import ClusterConfig
from devcluster.apiserver.patch import json_patch, merge_patch
from devcluster.apiserver.registry import ResourceType
from devcluster.apiserver.store import Store, clone
from devcluster.apiserver.validation import Validator

__all__ = ["MERGE_TYPES", "Operations", "now", "prune_nulls"]

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's utilrand alphabet
MERGE_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
_JSON_PATCH = "application/json-patch+json"
_APPLY = "application/apply-patch+yaml"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Operations:
    def __init__(self, config: ClusterConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self.validator = Validator(config)

    def current(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        obj = self.store.get(rt.storage, namespace, name)
        if obj is None:
            raise errors.not_found(rt.plural, rt.group, name)
        return obj

    def create(self, rt: ResourceType, namespace: str, body: Any) -> dict[str, Any]:
        keys: set[str] = set()
        body = prune_nulls(body, keys)
        meta = self.validator.typemeta(rt, body)
        self._namespace(rt, meta, namespace)
        if meta.get("resourceVersion"):
            raise errors.APIError(
                500, "InternalError", "resourceVersion should not be set on objects to be created"
            )
        if not meta.get("name") and meta.get("generateName"):
            base = str(meta["generateName"])[:58]
            meta["name"] = base + "".join(random.choices(_NAME_CHARS, k=5))
        if not meta.get("name"):
            cause = errors.FieldError.required("metadata.name", "name or generateName is required")
            raise errors.invalid(rt.kind, rt.group, "", [cause])
        if self.store.get(rt.storage, meta.get("namespace") or "", meta["name"]) is not None:
            raise errors.already_exists(rt.plural, rt.group, meta["name"])
        for server_set in ("uid", "creationTimestamp", "deletionTimestamp", "generation"):
            meta.pop(server_set, None)
        self.validator.schema(rt, body)
        strategy.reset_status_on_create(rt.storage, body)
        self._prepare(rt, body, None, keys)
        meta.update(uid=str(uuid4()), creationTimestamp=now())
        if rt.has_spec:
            meta["generation"] = 1
        return self.store.put(rt.storage, body, event_type="ADDED").obj

    def update(
        self, rt: ResourceType, namespace: str, name: str, body: Any, *, status: bool = False
    ) -> dict[str, Any]:
        """PUT semantics; with `status`, only `.status` of the body is taken."""
        old = self.current(rt, namespace, name)
        keys: set[str] = set()
        body = prune_nulls(body, keys)
        meta = self.validator.typemeta(rt, body)
        self._namespace(rt, meta, namespace)
        meta.setdefault("name", name)
        if meta["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match "
                f"the name on the URL ({name})"
            )
        self._preconditions(rt, old, uid=meta.get("uid"), rv=meta.get("resourceVersion"))
        if status:
            obj = clone(old)
            obj.pop("status", None)
            if body.get("status") is not None:
                obj["status"] = body["status"]
        else:
            obj = body
            for kept in ("uid", "creationTimestamp", "deletionTimestamp", "generation"):
                _copy_key(old["metadata"], meta, kept)
            if rt.status_subresource:
                _copy_key(old, obj, "status")
        self.validator.schema(rt, obj)
        self._prepare(rt, obj, old, None if status else keys)
        return self._commit(rt, obj, old)

    def patch(
        self, rt: ResourceType, namespace: str, name: str, body: Any, *,
        content_type: str, status: bool = False, field_manager: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        if content_type == _APPLY:
            return self._apply(rt, namespace, name, body, field_manager, status=status)
        old = self.current(rt, namespace, name)
        if content_type in MERGE_TYPES:
            if not isinstance(body, dict):
                raise errors.bad_request("merge patch body must be a JSON object")
            patched = merge_patch(clone(old), body)
        elif content_type == _JSON_PATCH:
            patched = json_patch(clone(old), body)
        else:
            raise errors.unsupported_media_type(content_type)
        return self.update(rt, namespace, name, patched, status=status)

    def _apply(
        self, rt: ResourceType, namespace: str, name: str, body: Any,
        field_manager: str | None, *, status: bool,
    ) -> dict[str, Any]:  # fmt: skip
        """Server-side apply, approximated as create-or-merge (no managedFields)."""
        if not field_manager:
            raise errors.bad_request(
                'PatchOptions.meta.k8s.io "" is invalid: '
                "fieldManager: Required value: is required for apply patch"
            )
        try:
            doc = yaml.safe_load(body) if isinstance(body, str | bytes) else body
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"error decoding YAML: {exc}") from exc
        if not isinstance(doc, dict):
            raise errors.bad_request("apply patch body must be an object")
        if self.store.get(rt.storage, namespace, name) is None and not status:
            doc.setdefault("metadata", {}).setdefault("name", name)
            return self.create(rt, namespace, doc)
        return self.patch(rt, namespace, name, doc, content_type=MERGE_TYPES[0], status=status)

    def delete(
        self, rt: ResourceType, namespace: str, name: str, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], bool]:
        """Returns (object, deleted now); objects with finalizers only get a deletionTimestamp."""
        old = self.current(rt, namespace, name)
        pre = (options or {}).get("preconditions") or {}
        self._preconditions(rt, old, uid=pre.get("uid"), rv=pre.get("resourceVersion"))
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return old, False
            obj = clone(old)
            obj["metadata"].update(deletionTimestamp=now(), deletionGracePeriodSeconds=0)
            if rt.has_spec:
                obj["metadata"]["generation"] = old["metadata"].get("generation", 0) + 1
            return self.store.put(rt.storage, obj, event_type="MODIFIED").obj, False
        return self.store.remove(rt.storage, clone(old)).obj, True

    def _namespace(self, rt: ResourceType, meta: dict[str, Any], namespace: str) -> None:
        if not rt.namespaced:
            meta.pop("namespace", None)
            return
        given = meta.setdefault("namespace", namespace)
        if given != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match "
                "the namespace sent on the request"
            )

    @staticmethod
    def _preconditions(rt: ResourceType, old: dict[str, Any], *, uid: Any, rv: Any) -> None:
        meta = old["metadata"]
        name = meta["name"]
        if uid and uid != meta["uid"]:
            detail = f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta['uid']}"  # noqa: E501
            raise errors.conflict(rt.plural, rt.group, name, detail)
        if rv and rv != meta["resourceVersion"]:
            detail = "the object has been modified; please apply your changes to the latest version and try again"  # noqa: E501
            raise errors.conflict(rt.plural, rt.group, name, detail)

    def _prepare(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        keys: set[str] | None,
    ) -> None:
        strategy.drop_disabled_fields(rt.storage, obj, old, self.config, present=keys)
        strategy.set_taint_times(rt.storage, obj, old, now=now())
        admitted = admission.admin_access(rt.storage, obj, old, self._namespace_object)
        self.validator.semantics(rt, obj, old, first=admitted)

    def _namespace_object(self, name: str) -> dict[str, Any] | None:
        return self.store.get("namespaces", "", name)

    def _commit(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        if rt.has_spec and obj.get("spec") != old.get("spec"):
            meta["generation"] = old["metadata"].get("generation", 0) + 1
        if obj == old:
            return old  # like kube: a no-op update writes nothing and keeps the resourceVersion
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self.store.remove(rt.storage, obj).obj
        return self.store.put(rt.storage, obj, event_type="MODIFIED").obj


def prune_nulls(value: Any, keys: set[str]) -> Any:
    """Drop null object members in place, as decoding into Go structs with omitempty does;
    collects every object key seen into `keys`. `value` must be a private copy."""
    if type(value) is dict:
        keys.update(value)
        for key in [k for k, v in value.items() if v is None]:
            del value[key]
        for item in value.values():
            if type(item) is dict or type(item) is list:
                prune_nulls(item, keys)
    elif type(value) is list:
        for item in value:
            if type(item) is dict or type(item) is list:
                prune_nulls(item, keys)
    return value


def _copy_key(source: dict[str, Any], target: dict[str, Any], key: str) -> None:
    if key in source:
        target[key] = clone(source[key])
    else:
        target.pop(key, None)
