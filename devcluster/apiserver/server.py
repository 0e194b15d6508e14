"""`APIServerEmulator`: lifecycle (start/stop on a free port, kubeconfig) and in-process access.

Tests use the in-process API (`objects`, `get_object`, `create_object`, `request_log`,
`faults`) next to real HTTP clients; both go through the same validation and store.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from devcluster.apiserver import errors, kubeconfig
from devcluster.apiserver.app import build_app
from devcluster.apiserver.cluster import Cluster
from devcluster.apiserver.config import ClusterConfig
from devcluster.apiserver.faults import Faults
from devcluster.apiserver.registry import Registry, ResourceType
from devcluster.apiserver.requestlog import RequestLog
from devcluster.apiserver.store import Store, clone

__all__ = ["LISTEN_BACKLOG", "APIServerEmulator"]

LISTEN_BACKLOG = 4096
"""Connections the kernel queues before the server accepts them (aiohttp's default is 128). A
fleet's agents connect thousands at a time; with 128, the queue overflows while the event loop
is busy and the kernel drops their SYNs, which the clients see as the server no longer
accepting. Linux caps it at `net.core.somaxconn` (4096 by default)."""


class APIServerEmulator:
    """A kube-apiserver stand-in: `async with APIServerEmulator(ClusterConfig.for_tests()) as s`."""

    def __init__(
        self,
        config: ClusterConfig | None = None,
        *,
        kubernetes_version: str | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        token: str | None = None,
    ) -> None:
        """Keyword arguments override the matching `config` fields (gates are merged)."""
        base = config or ClusterConfig()
        changes: dict[str, Any] = {}
        if kubernetes_version is not None:
            changes["kubernetes_version"] = kubernetes_version
        if feature_gates is not None:
            changes["feature_gates"] = {**base.feature_gates, **feature_gates}
        if token is not None:
            changes["token"] = token
        self.config = dataclasses.replace(base, **changes)
        self.cluster = Cluster(self.config)
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    @property
    def store(self) -> Store:
        return self.cluster.store

    @property
    def registry(self) -> Registry:
        return self.cluster.registry

    @property
    def request_log(self) -> RequestLog:
        return self.cluster.request_log

    @property
    def faults(self) -> Faults:
        return self.cluster.faults

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("apiserver emulator not started")
        return self._url

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, tls: ssl.SSLContext | None = None
    ) -> None:
        """Listen on `host:port` (0: a free port); over HTTPS with `tls`, as a real API server."""
        if self._runner is not None:
            raise RuntimeError("apiserver emulator already started")
        runner = web.AppRunner(build_app(self.cluster), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=tls, backlog=LISTEN_BACKLOG)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        bound_host, bound_port = runner.addresses[0][:2]
        self._runner = runner
        self.cluster.server_address = f"{bound_host}:{bound_port}"
        self._url = f"{'https' if tls else 'http'}://{bound_host}:{bound_port}"

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self.store.close_watches()
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def write_kubeconfig(self, path: str | Path, *, ca_file: str | None = None) -> Path:
        """A kubeconfig for this server; `ca_file` is the CA that signed its TLS certificate."""
        return kubeconfig.write(path, self.url, token=self.config.token, ca_file=ca_file)

    # In-process access. Objects going in are copied; objects coming out are copies.

    def _type(self, resource: str) -> ResourceType:
        rt = self.registry.for_plural(resource)
        if rt is None:
            raise KeyError(f"resource {resource!r} is not served by this emulator config")
        return rt

    def objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """All stored objects of a resource plural (e.g. "resourceslices"), in key order."""
        rt = self._type(resource)
        return [clone(o) for o in self.store.items(rt.storage, namespace)]

    def get_object(
        self, resource: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        obj = self.store.get(self._type(resource).storage, namespace or "", name)
        return None if obj is None else clone(obj)

    def create_object(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create like a POST would (validation included); raises `APIError`."""
        rt = self._kind_type(obj)
        namespace = (obj.get("metadata") or {}).get("namespace") or ""
        created = self.cluster.operations.create(rt, namespace, clone(dict(obj)))
        return dict(clone(created))

    def update_object(self, obj: Mapping[str, Any], *, status: bool = False) -> dict[str, Any]:
        """Replace like a PUT (or a PUT to /status with `status=True`); raises `APIError`."""
        rt = self._kind_type(obj)
        meta = obj.get("metadata") or {}
        body = clone(dict(obj))
        updated = self.cluster.operations.update(
            rt, meta.get("namespace") or "", meta.get("name") or "", body, status=status
        )
        return dict(clone(updated))

    def delete_object(self, resource: str, name: str, namespace: str | None = None) -> None:
        rt = self._type(resource)
        self.cluster.operations.delete(rt, namespace or "", name)

    def _kind_type(self, obj: Mapping[str, Any]) -> ResourceType:
        rt = self.registry.for_kind(str(obj.get("apiVersion")), str(obj.get("kind")))
        if rt is None:
            message = (
                f"no kind {obj.get('kind')!r} is registered for version {obj.get('apiVersion')!r}"
            )
            raise errors.APIError(404, "NotFound", message)
        return rt
