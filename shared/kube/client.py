"""A small typed client over kubernetes-asyncio for the raw JSON objects dra-suite handles.

Objects stay plain dicts (what the API serves, field for field), so that fields newer than the
client's models survive a read-modify-write. Auth and TLS come from kubernetes-asyncio's
in-cluster or kubeconfig loaders; every failure leaves as an error of `shared.errors`.
"""

from __future__ import annotations

import asyncio
import builtins
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
import structlog
import yaml
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.config.config_exception import ConfigException
from opentelemetry import trace

from shared import metrics, telemetry, yamlload
from shared.config import KubeSettings
from shared.errors import ConfigError, KubeError, KubeNotFoundError, KubeTransientError
from shared.kube import errors
from shared.kube.resources import ResourceType
from shared.kube.transport import use_static_proxy_settings

__all__ = ["KubeClient", "PatchType", "WatchEvent"]

log = structlog.get_logger(__name__)
_tracer = telemetry.tracer(__name__)
_requests = metrics.meter(__name__).create_counter(
    "dra_kube_requests", unit="1", description="Kubernetes API requests by verb, resource and code."
)

Obj = dict[str, Any]
PatchType = Literal["merge", "strategic", "json"]
_PATCH_CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    object: Obj


class KubeClient:
    """Generic CRUD + watch over `ResourceType`s, JSON in and out."""

    def __init__(self, api: k8s_client.ApiClient, *, request_timeout_s: float) -> None:
        self._api = api
        self._timeout_s = request_timeout_s

    @classmethod
    async def connect(cls, settings: KubeSettings) -> KubeClient:
        """Load credentials: the given kubeconfig, else in-cluster, else ~/.kube/config."""
        configuration = k8s_client.Configuration()
        try:
            if settings.kubeconfig:
                _check_kubeconfig(settings.kubeconfig)
                await k8s_config.load_kube_config(
                    config_file=settings.kubeconfig, client_configuration=configuration
                )
            else:
                try:
                    k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]  # untyped upstream
                        client_configuration=configuration
                    )
                except ConfigException:
                    await k8s_config.load_kube_config(client_configuration=configuration)
        except (ConfigException, OSError) as exc:
            raise ConfigError(f"kubernetes client config: {exc}", field="kubeconfig") from exc
        except (yaml.YAMLError, TypeError, ValueError, KeyError, AttributeError) as exc:
            # The client's loader trips over a file of the wrong shape with a bare TypeError.
            where = settings.kubeconfig or "$KUBECONFIG or ~/.kube/config"
            raise ConfigError(
                f"kubernetes client config: malformed kubeconfig {where}: {exc!r}",
                field="kubeconfig",
            ) from exc
        api = k8s_client.ApiClient(configuration)
        api.user_agent = "dra-suite/0.1"
        use_static_proxy_settings(api)
        return cls(api, request_timeout_s=settings.request_timeout_s)

    async def close(self) -> None:
        await self._api.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        name: str = "",
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> Obj:
        # One client span per API call, named by verb and resource (`kube.update resourceslices`).
        with _tracer.start_as_current_span(
            f"kube.{what.split(' ')[0]} {rt_plural(path, name=name)}",
            kind=trace.SpanKind.CLIENT,
            attributes={"http.request.method": method, "url.path": path},
        ) as span:
            response = await self._send(
                method,
                path,
                what=what,
                query=query,
                body=body,
                content_type=content_type,
                timeout_s=timeout_s or self._timeout_s,
            )
            span.set_attribute("http.response.status_code", response.status)
            _requests.add(
                1,
                {
                    "verb": what.split(" ")[0],
                    "resource": rt_plural(path, name=name),
                    "code": str(response.status),
                },
            )
            try:
                data = await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise KubeTransientError(f"{what}: reading the answer: {exc}") from exc
            finally:
                response.release()
        if not 200 <= response.status < 300:
            raise errors.from_status(
                response.status,
                data,
                what=what,
                name=name,
                retry_after=response.headers.get("Retry-After"),
            )
        try:
            result: Obj = json.loads(data) if data else {}
        except ValueError as exc:  # not JSON, or a number beyond Python's 4300-digit limit
            raise KubeError(
                f"{what}: the API server's answer is not decodable JSON: {exc}",
                status=response.status,
                name=name,
            ) from exc
        except RecursionError as exc:  # the API server stores opaque JSON of any depth
            raise KubeError(
                f"{what}: the API server's answer is nested too deeply to decode",
                status=response.status,
                name=name,
            ) from exc
        return result

    async def _send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: list[tuple[str, str]] | None,
        body: Any,
        content_type: str,
        timeout_s: float | aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        try:
            response: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout_s,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeTransientError(f"{what}: {type(exc).__name__}: {exc}") from exc
        return response

    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Obj:
        return await self._request(
            "GET",
            rt.path(namespace=namespace, name=name),
            what=f"get {rt.plural}/{name}",
            name=name,
        )

    async def list(
        self,
        rt: ResourceType,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> Obj:
        """The whole List object (items and metadata.resourceVersion)."""
        query = _selectors(label_selector, field_selector)
        return await self._request(
            "GET", rt.path(namespace=namespace), what=f"list {rt.plural}", query=query
        )

    async def create(self, rt: ResourceType, body: Obj, *, namespace: str | None = None) -> Obj:
        name = body.get("metadata", {}).get("name", "") or body.get("metadata", {}).get(
            "generateName", ""
        )
        return await self._request(
            "POST",
            rt.path(namespace=namespace),
            what=f"create {rt.plural}/{name}",
            name=name,
            body=body,
        )

    async def replace(
        self, rt: ResourceType, body: Obj, *, namespace: str | None = None, subresource: str = ""
    ) -> Obj:
        name = body["metadata"]["name"]
        return await self._request(
            "PUT",
            rt.path(namespace=namespace, name=name, subresource=subresource),
            what=f"update {rt.plural}/{name}",
            name=name,
            body=body,
        )

    async def patch(
        self,
        rt: ResourceType,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: str = "",
    ) -> Obj:
        return await self._request(
            "PATCH",
            rt.path(namespace=namespace, name=name, subresource=subresource),
            what=f"patch {rt.plural}/{name}",
            name=name,
            body=patch,
            content_type=_PATCH_CONTENT_TYPES[patch_type],
        )

    async def delete(
        self,
        rt: ResourceType,
        name: str,
        *,
        namespace: str | None = None,
        uid: str = "",
        resource_version: str = "",
        grace_period_s: int | None = None,
    ) -> None:
        """Delete with optional preconditions; a missing object raises KubeNotFoundError.

        `grace_period_s=0` ends a pod's graceful deletion, as the kubelet does once its
        containers are gone."""
        preconditions = {
            k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v
        }
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if preconditions:
            body["preconditions"] = preconditions
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        await self._request(
            "DELETE",
            rt.path(namespace=namespace, name=name),
            what=f"delete {rt.plural}/{name}",
            name=name,
            body=body if len(body) > 2 else None,
        )

    async def get_path(self, path: str) -> Obj:
        """GET a non-resource path (`/version`, `/apis/<group>`) and return its JSON object."""
        return await self._request("GET", path, what=f"get {path}")

    async def served_versions(self, group: str) -> builtins.list[str]:
        """Versions of an API group the server serves, preferred first; [] when not served."""
        try:
            answer = await self._request("GET", f"/apis/{group}", what=f"discover {group}")
        except KubeNotFoundError:
            return []
        preferred = answer.get("preferredVersion", {}).get("version", "")
        versions = [v["version"] for v in answer.get("versions", [])]
        return sorted(versions, key=lambda v: v != preferred)

    async def watch(
        self,
        rt: ResourceType,
        *,
        resource_version: str,
        namespace: str | None = None,
        field_selector: str = "",
        label_selector: str = "",
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        """Stream events after `resource_version` until the server ends the watch.

        Raises KubeExpiredError (410) when the version is too old: relist, then watch again.
        """
        query = [
            *_selectors(label_selector, field_selector),
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        what = f"watch {rt.plural}"
        response = await self._send(
            "GET",
            rt.path(namespace=namespace),
            what=what,
            query=query,
            body=None,
            content_type="application/json",
            timeout_s=aiohttp.ClientTimeout(
                total=None, sock_connect=self._timeout_s, sock_read=timeout_s + 30
            ),
        )
        try:
            if response.status != 200:
                raise errors.from_status(response.status, await response.read(), what=what)
            while True:
                try:
                    line = await response.content.readline()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise KubeTransientError(f"{what}: stream cut: {exc}") from exc
                if not line:
                    return
                try:
                    event = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    raise KubeTransientError(f"{what}: undecodable watch event: {exc}") from exc
                if event.get("type") == "ERROR":
                    status = event.get("object", {})
                    raise errors.from_status(
                        int(status.get("code", 500)), json.dumps(status).encode(), what=what
                    )
                yield WatchEvent(type=event["type"], object=event["object"])
        finally:
            response.release()
            await asyncio.sleep(0)


def rt_plural(path: str, *, name: str) -> str:
    """The resource plural of a REST path: the segment before the object's name, if any."""
    parts = path.rstrip("/").split("/")
    if name and name in parts[1:]:
        return parts[parts.index(name, 1) - 1]
    return parts[-1]


def _selectors(label_selector: str, field_selector: str) -> list[tuple[str, str]]:
    query: list[tuple[str, str]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


def _check_kubeconfig(path: str) -> None:
    """An empty or malformed kubeconfig as a ConfigError that names the file and the fault."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"kubeconfig {path}: cannot read it: {exc}", field="kubeconfig") from exc
    try:
        data = yamlload.load(text)
    except yaml.YAMLError as exc:
        problem = str(exc).splitlines()[0]
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem and exc.problem_mark:
            mark = exc.problem_mark
            problem = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
        raise ConfigError(
            f"kubeconfig {path} is not valid YAML: {problem}", field="kubeconfig"
        ) from exc
    if not isinstance(data, dict) or not data:
        what = "empty" if data is None or data == {} else f"a {type(data).__name__}"
        raise ConfigError(
            f"kubeconfig {path} is {what}, not a kubeconfig (clusters, users, contexts)",
            field="kubeconfig",
        )
