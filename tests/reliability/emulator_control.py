"""The API emulator's test-control endpoints over HTTP (the stack runs it as a process).

`/_emulator/faults` adds and clears fault rules, `/_emulator/watches/close` cuts every open
watch, `/_emulator/requests` is the request log. `wipe_slices` does what the kubelet does to a
node's slices when it starts: one DELETE collection with `spec.nodeName=<node>`.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import aiohttp

__all__ = ["SLICES", "TAINT_RULES", "EmulatorControl", "write_rules"]

Obj = dict[str, Any]
SLICES = "resourceslices"
TAINT_RULES = "devicetaintrules"
_WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


def write_rules(resource: str, **fault: Any) -> list[Obj]:
    """One fault rule per write verb of `resource`: `write_rules(SLICES, status=500)`."""
    return [{"resource": resource, "verb": verb, **fault} for verb in _WRITE_VERBS]


class EmulatorControl:
    """`async with EmulatorControl(stack.api_url) as api:` fault rules, watches, request log."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        return self

    async def __aexit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(self, method: str, path: str, *, body: Any = None, **query: str) -> Any:
        assert self._session is not None, "use `async with EmulatorControl(...)`"
        async with self._session.request(
            method, self.url + path, json=body, params=query or None
        ) as response:
            answer = await response.json()
            if response.status >= 300:
                raise AssertionError(f"{method} {path}: {response.status} {answer}")
            return answer

    async def add_faults(self, rules: list[Obj]) -> list[Obj]:
        added: list[Obj] = (await self._call("POST", "/_emulator/faults", body=rules))["items"]
        return added

    async def faults(self) -> list[Obj]:
        rules: list[Obj] = (await self._call("GET", "/_emulator/faults"))["items"]
        return rules

    async def clear_faults(self) -> None:
        await self._call("DELETE", "/_emulator/faults")

    async def close_watches(self) -> int:
        closed: int = (await self._call("POST", "/_emulator/watches/close"))["closed"]
        return closed

    async def requests(self, **filters: str) -> list[Obj]:
        """Request log records; filters: verb, resource, name, method."""
        records: list[Obj] = (await self._call("GET", "/_emulator/requests", **filters))["items"]
        return records

    async def writes(self, resource: str, *, since: float = 0.0, until: float = 1e12) -> list[Obj]:
        """Write requests to `resource` that started in [since, until) (wall-clock)."""
        return [
            r
            for r in await self.requests(resource=resource)
            if r["verb"] in _WRITE_VERBS and since <= r["timestamp"] < until
        ]

    async def clear_requests(self) -> None:
        await self._call("DELETE", "/_emulator/requests")

    async def wipe_slices(self, node: str) -> Obj:
        """The kubelet's wipe: DELETE every ResourceSlice of `node` in one call."""
        answer: Obj = await self._call(
            "DELETE",
            "/apis/resource.k8s.io/v1/resourceslices",
            fieldSelector=f"spec.nodeName={node}",
        )
        return answer
