"""`kubectl apply` of rendered manifests, the way tests need it: each object created through
its REST path (found by API discovery) with strict server-side field validation, and deleted
again in reverse order."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from shared.errors import KubeAlreadyExistsError, KubeNotFoundError
from shared.kube.client import KubeClient

__all__ = ["Applier"]

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Kind:
    path: str
    namespaced: bool


class Applier:
    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.created: list[tuple[str, Obj]] = []
        self._kinds: dict[tuple[str, str], _Kind] = {}

    async def create(self, doc: Obj) -> Obj:
        """POST `doc` with `fieldValidation=Strict`; raises the API's refusal as KubeError.
        A Namespace that exists already is kept (deleting one takes a while, so namespaces
        are never deleted here)."""
        kind = await self._kind(doc["apiVersion"], doc["kind"])
        namespace = doc["metadata"].get("namespace", "default") if kind.namespaced else ""
        base = f"{kind.path}".replace("{namespace}", namespace)
        try:
            stored = await self.client._request(
                "POST", base, what=f"create {doc['kind']}/{doc['metadata']['name']}",
                query=[("fieldValidation", "Strict")], body=doc,
            )  # fmt: skip
        except KubeAlreadyExistsError:
            if doc["kind"] != "Namespace":
                raise
            return await self.client.get_path(f"{base}/{doc['metadata']['name']}")
        if doc["kind"] != "Namespace":
            self.created.append((f"{base}/{doc['metadata']['name']}", stored))
        return stored

    async def delete_all(self) -> None:
        """Delete what `create` made (but namespaces), newest first."""
        while self.created:
            path, _ = self.created.pop()
            with contextlib.suppress(KubeNotFoundError):
                await self.client._request("DELETE", path, what=f"delete {path}")

    async def _kind(self, api_version: str, kind: str) -> _Kind:
        key = (api_version, kind)
        if key not in self._kinds:
            group_path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
            listed = await self.client.get_path(group_path)
            for resource in listed["resources"]:
                if "/" in resource["name"]:
                    continue
                path = group_path
                if resource["namespaced"]:
                    path += "/namespaces/{namespace}"
                path += f"/{resource['name']}"
                self._kinds[(api_version, resource["kind"])] = _Kind(path, resource["namespaced"])
        return self._kinds[key]
