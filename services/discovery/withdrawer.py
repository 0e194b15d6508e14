"""The slice withdrawer: keeps this node without ResourceSlices of our driver.

On a node served by the device-plugin front (`--publish-slices false`), the devices are handed
out by the kubelet's device manager, so the scheduler must not allocate them through DRA as
well. The discovery agent still publishes the inventory on the bus (the device-plugin front
and the health agent read it); this task deletes every slice of this driver on this node,
the ones left from the time the node ran the DRA front included, and any that appears later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import structlog

from shared.backoff import Backoff
from shared.errors import KubeConflictError, KubeError, KubeNotFoundError, RecoverableError
from shared.kube import watch
from shared.kube.client import KubeClient, WatchEvent
from shared.kube.resources import RESOURCE_SLICES

__all__ = ["SliceWithdrawer"]

log = structlog.get_logger(__name__)

Obj = dict[str, Any]


class SliceWithdrawer:
    """Deletes this driver's slices on this node, now and whenever one shows up."""

    def __init__(
        self, client: KubeClient, *, driver: str, node: str, backoff: Backoff | None = None
    ) -> None:
        self.client = client
        self.driver = driver
        self.node = node
        self.published = asyncio.Event()
        """Set once a listing showed no slice left (the node's "published" state: none)."""
        self._backoff = backoff or Backoff(initial_s=0.1, max_s=10.0)
        self._actual: dict[str, Obj] = {}
        self._wake = asyncio.Event()

    @property
    def rejections(self) -> Mapping[str, str]:
        """Always empty: nothing is written, so the API server has nothing to reject."""
        return MappingProxyType({})

    @property
    def field_selector(self) -> str:
        return f"spec.nodeName={self.node},spec.driver={self.driver}"

    async def run(self) -> None:
        """Eternal: follow this node's slices of our driver and delete each one."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._follow_slices(), name="slice-watch")
            await self._withdraw_forever()

    async def _follow_slices(self) -> None:
        async for item in watch.reflect(
            self.client, RESOURCE_SLICES, field_selector=self.field_selector
        ):
            if isinstance(item, WatchEvent):
                name = str(item.object.get("metadata", {}).get("name", ""))
                if item.type == "DELETED":
                    self._actual.pop(name, None)
                else:
                    self._actual[name] = item.object
            else:
                self._actual = {
                    str(obj.get("metadata", {}).get("name", "")): obj for obj in item.items
                }
            self._wake.set()

    async def _withdraw_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                for obj in list(self._actual.values()):
                    await self._delete(obj)
            except (KubeError, RecoverableError) as exc:
                delay = self._backoff.next_delay()
                log.warning(
                    "slice_withdraw_failed",
                    driver=self.driver,
                    node=self.node,
                    error=str(exc),
                    retry_in_s=round(delay, 2),
                )
                await asyncio.sleep(delay)
                self._wake.set()
                continue
            self._backoff.reset()
            if not self._actual and not self.published.is_set():
                self.published.set()

    async def _delete(self, obj: Obj) -> None:
        metadata = obj.get("metadata", {})
        name = str(metadata.get("name", ""))
        try:
            await self.client.delete(
                RESOURCE_SLICES,
                name,
                uid=metadata.get("uid", ""),
                resource_version=metadata.get("resourceVersion", ""),
            )
        except KubeNotFoundError:
            pass
        except KubeConflictError:
            # Changed since we saw it (e.g. the other front's agent still wrote it): the watch
            # brings the new version, and the next round deletes that one.
            return
        self._actual.pop(name, None)
        log.info("slice_withdrawn", driver=self.driver, node=self.node, slice=name)
