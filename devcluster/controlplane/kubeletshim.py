"""The kubelet's DRA part for a Node that has no kubelet: it watches the Pods bound to the
node and drives the kubelet emulator's prepare and unprepare for their claims.

What it copies from the kubelet's DRA manager: a pod's claims are those of
`spec.resourceClaims`, by `resourceClaimName` or, for a claim from a template, by the name in
`status.resourceClaimStatuses`; only claims allocated to our driver go to our plugin, all of a
pod's in one NodePrepareResources call, retried until it succeeds; a claim shared by several
pods of the node is prepared once and unprepared after its last pod is gone. When a pod is
marked for deletion the shim unprepares (if that pod was the claim's last user) and then
finishes the deletion with a zero grace period, as the kubelet does once containers are gone.
A prepared pod's phase is posted as Running, so a watcher sees what a kubelet would report.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from devcluster.kubelet import KubeletClaim, KubeletEmulator, KubeletError
from shared.errors import DraSuiteError, KubeExpiredError, KubeNotFoundError
from shared.kube.client import KubeClient
from shared.kube.resources import PODS, RESOURCE_CLAIMS

__all__ = ["KubeletShim", "PodClaims"]

log = structlog.get_logger(__name__)
_RETRY_S = 0.5


@dataclass
class PodClaims:
    """What the shim did for one pod."""

    claims: list[KubeletClaim] = field(default_factory=list)
    cdi_devices: dict[str, list[str]] = field(default_factory=dict)
    """CDI device IDs per claim UID, from the plugin's answer."""
    error: str = ""
    """The last prepare error; empty once prepared."""
    seen_at: float = 0.0
    """`time.monotonic()` when the shim first saw the pod bound to its node."""
    prepared_at: float = 0.0
    """`time.monotonic()` when the plugin answered the pod's prepare without an error."""


class KubeletShim:
    """`async with KubeletShim(client, kubelet, node=..., driver=...):` runs in the block."""

    def __init__(
        self, client: KubeClient, kubelet: KubeletEmulator, *, node: str, driver: str
    ) -> None:
        self.client = client
        self.kubelet = kubelet
        self.node = node
        self.driver = driver
        self.pods: dict[str, PodClaims] = {}
        """Prepared pods by `namespace/name`."""
        self.unprepared: list[KubeletClaim] = []
        """Claims unprepared so far, in order."""
        self._users: dict[str, set[str]] = {}
        self._pending: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()
        """Set after every pod the shim prepares or releases (tests wait on it)."""

    async def __aenter__(self) -> KubeletShim:
        self._task = asyncio.create_task(self._run(), name=f"kubelet-shim-{self.node}")
        return self

    async def __aexit__(self, *_: object) -> None:
        for key in list(self._pending):
            await self._cancel_pending(key)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        selector = f"spec.nodeName={self.node}"
        while True:
            try:
                listed = await self.client.list(PODS, field_selector=selector)
                for pod in listed["items"]:
                    await self._sync(pod)
                version = listed["metadata"]["resourceVersion"]
                async for event in self.client.watch(
                    PODS, resource_version=version, field_selector=selector, timeout_s=60
                ):
                    if event.type == "BOOKMARK":
                        continue
                    if event.type == "DELETED":
                        await self._cancel_pending(_key(event.object))
                        await self._release(event.object)
                    else:
                        await self._sync(event.object)
            except KubeExpiredError:
                continue
            except DraSuiteError as exc:
                log.warning("kubelet_shim_watch_failed", node=self.node, error=str(exc))
                await asyncio.sleep(_RETRY_S)

    async def _sync(self, pod: dict[str, Any]) -> None:
        key = _key(pod)
        if pod["metadata"].get("deletionTimestamp"):
            await self._cancel_pending(key)
            await self._release(pod)
            with contextlib.suppress(KubeNotFoundError):
                await self.client.delete(
                    PODS, pod["metadata"]["name"], namespace=pod["metadata"]["namespace"],
                    uid=pod["metadata"]["uid"], grace_period_s=0,
                )  # fmt: skip
            return
        prepared = key in self.pods and not self.pods[key].error
        if not prepared and key not in self._pending:
            task = asyncio.create_task(self._prepare_until_done(pod), name=f"prepare-{key}")
            self._pending[key] = task
            task.add_done_callback(lambda _: self._pending.pop(key, None))

    async def _prepare_until_done(self, pod: dict[str, Any]) -> None:
        """Prepare, retrying with the pod as it is now, until done or the pod is gone."""
        meta = pod["metadata"]
        while not await self._prepare(pod):
            await asyncio.sleep(_RETRY_S)
            try:
                pod = await self.client.get(PODS, meta["name"], namespace=meta["namespace"])
            except KubeNotFoundError:
                return
            if pod["metadata"]["uid"] != meta["uid"] or pod["metadata"].get("deletionTimestamp"):
                return

    async def _cancel_pending(self, key: str) -> None:
        task = self._pending.pop(key, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _prepare(self, pod: dict[str, Any]) -> bool:
        """Prepare the pod's claims of our driver; False when it must be tried again."""
        key = _key(pod)
        record = self.pods.setdefault(key, PodClaims(seen_at=time.monotonic()))
        try:
            claims = await self._our_claims(pod)
        except _NotYet as exc:
            record.error = str(exc)
            return False
        if claims:
            try:
                answer = await self.kubelet.prepare(claims)
            except KubeletError as exc:
                record.error = str(exc)
                return False
            failed = {uid: r.error for uid, r in answer.claims.items() if r.error}
            if failed:
                record.error = "; ".join(f"{uid}: {err}" for uid, err in sorted(failed.items()))
                log.info("kubelet_shim_prepare_failed", pod=key, error=record.error)
                return False
            record.cdi_devices = {
                uid: [cdi for d in r.devices for cdi in d.cdi_device_ids]
                for uid, r in answer.claims.items()
            }
        record.claims, record.error, record.prepared_at = claims, "", time.monotonic()
        for claim in claims:
            self._users.setdefault(claim.uid, set()).add(key)
        await self._post_running(pod)
        self.changed.set()
        return True

    async def _our_claims(self, pod: dict[str, Any]) -> list[KubeletClaim]:
        namespace = pod["metadata"]["namespace"]
        generated = {
            s["name"]: s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        claims: list[KubeletClaim] = []
        for entry in pod["spec"].get("resourceClaims") or []:
            name = entry.get("resourceClaimName") or generated.get(entry["name"])
            if not name:
                if entry.get("resourceClaimTemplateName") and entry["name"] not in generated:
                    raise _NotYet(f"claim {entry['name']} not made from its template yet")
                continue  # the template produced no claim (a request for nothing)
            try:
                claim = await self.client.get(RESOURCE_CLAIMS, name, namespace=namespace)
            except KubeNotFoundError as exc:
                raise _NotYet(f"claim {namespace}/{name} not found") from exc
            allocation = (claim.get("status") or {}).get("allocation")
            if not allocation:
                raise _NotYet(f"claim {namespace}/{name} is not allocated")
            results = allocation["devices"].get("results") or []
            if any(r["driver"] == self.driver for r in results):
                claims.append(KubeletClaim(namespace, name, claim["metadata"]["uid"]))
        return claims

    async def _release(self, pod: dict[str, Any]) -> None:
        record = self.pods.pop(_key(pod), None)
        if record is None:
            return
        last = []
        for claim in record.claims:
            users = self._users.get(claim.uid, set())
            users.discard(_key(pod))
            if not users:
                self._users.pop(claim.uid, None)
                last.append(claim)
        if last:
            while True:
                try:
                    answer = await self.kubelet.unprepare(last)
                except KubeletError as exc:
                    log.info("kubelet_shim_unprepare_failed", pod=_key(pod), error=str(exc))
                    await asyncio.sleep(_RETRY_S)
                    continue
                if not any(r.error for r in answer.claims.values()):
                    break
                await asyncio.sleep(_RETRY_S)
            self.unprepared.extend(last)
        self.changed.set()

    async def _post_running(self, pod: dict[str, Any]) -> None:
        status = {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"},
        ]}}  # fmt: skip
        meta = pod["metadata"]
        with contextlib.suppress(KubeNotFoundError):
            await self.client.patch(
                PODS, meta["name"], status, namespace=meta["namespace"], subresource="status"
            )


class _NotYet(Exception):
    """The pod's claims are not ready to prepare (not made, not allocated); try again."""


def _key(pod: dict[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
