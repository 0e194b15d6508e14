"""A fake of the two API calls the device-status publisher makes: GET a claim and PUT its
status (with resourceVersion preconditions, as the API server checks them)."""

from __future__ import annotations

import copy
from typing import Any

from shared.errors import KubeConflictError, KubeError, KubeNotFoundError
from shared.kube.resources import ResourceType

Obj = dict[str, Any]


class FakeClaimStatusAPI:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], Obj] = {}
        self.puts: list[Obj] = []
        self.gets = 0
        self.conflicts = 0
        """The next this many PUTs fail with 409, as if another writer came first."""
        self.refuse: str = ""
        """Non-empty: every PUT fails with 403 and this message."""

    def put(self, claim: Obj) -> None:
        claim = copy.deepcopy(claim)
        claim["metadata"].setdefault("resourceVersion", "1")
        self.claims[(claim["metadata"]["namespace"], claim["metadata"]["name"])] = claim

    def claim(self, namespace: str, name: str) -> Obj:
        return self.claims[(namespace, name)]

    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Obj:
        self.gets += 1
        try:
            return copy.deepcopy(self.claims[(namespace or "", name)])
        except KeyError:
            raise KubeNotFoundError(f"get {rt.plural}/{name}: 404", status=404) from None

    async def replace(
        self, rt: ResourceType, body: Obj, *, namespace: str | None = None, subresource: str = ""
    ) -> Obj:
        assert subresource == "status"
        key = (namespace or "", body["metadata"]["name"])
        stored = self.claims.get(key)
        if stored is None:
            raise KubeNotFoundError("404", status=404)
        if self.refuse:
            raise KubeError(self.refuse, status=403)
        version = stored["metadata"]["resourceVersion"]
        if self.conflicts or body["metadata"].get("resourceVersion") != version:
            self.conflicts = max(0, self.conflicts - 1)
            stored["metadata"]["resourceVersion"] = str(int(version) + 1)
            raise KubeConflictError("409 the object has been modified", name=key[1])
        stored = {**stored, "status": copy.deepcopy(body["status"])}
        stored["metadata"] = {**stored["metadata"], "resourceVersion": str(int(version) + 1)}
        self.claims[key] = stored
        self.puts.append(copy.deepcopy(stored))
        return copy.deepcopy(stored)
