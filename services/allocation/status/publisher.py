"""The `device-status` task: keeps this driver's entries of each prepared claim's
`status.devices` on the API server (KEP-4817).

`prepared()` and `unprepared()` only record what is wanted and return at once: a prepare never
waits on the API server, nor fails because of it (as with the prepared-claims KV). The task
writes what changed: after a prepare, the entries of the claim; after an unprepare, none of
ours; whenever the health board changes, the entries whose `Healthy` condition changed. Each
write reads the claim, replaces only this driver's entries and PUTs the claim's status with the
read resourceVersion (a conflict reads again); a claim that is gone, replaced (another UID) or
no longer allocated is left alone. A refused write (no RBAC grant, an admission policy) is
logged and tried again only at the claim's next change, never in a loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from services.allocation.claim.checkpoint import PreparedClaim
from services.allocation.claim.claims import PodRef
from services.allocation.node_view.health_board import DeviceHealthView, HealthBoard
from services.allocation.status.entries import Entry, entries, merge
from shared.backoff import Backoff
from shared.errors import KubeConflictError, KubeError, KubeNotFoundError, RecoverableError
from shared.kube.resources import RESOURCE_CLAIMS, ResourceType
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["DeviceStatusPublisher", "InventorySource", "StatusAPI"]

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
_CONFLICT_ATTEMPTS = 5


class StatusAPI(Protocol):
    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Obj: ...

    async def replace(
        self, rt: ResourceType, body: Obj, *, namespace: str | None = None, subresource: str = ""
    ) -> Obj: ...


class InventorySource(Protocol):
    @property
    def current(self) -> inventory_pb2.Inventory | None: ...


def _rfc3339(unix_s: float) -> str:
    return datetime.fromtimestamp(int(unix_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class DeviceStatusPublisher:
    def __init__(
        self,
        kube: StatusAPI,
        *,
        driver: str,
        node: str,
        inventory: InventorySource,
        board: HealthBoard,
        clock: Callable[[], float] = time.time,
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`quiet`: awaited before each claim's write (`hot_path.KubeletCalls.quiet`)."""
        self._kube = kube
        self._quiet = quiet
        self._driver = driver
        self._node = node
        self._inventory = inventory
        self._board = board
        self._clock = clock
        self._records: dict[str, PreparedClaim] = {}
        self._dirty: dict[str, PreparedClaim] = {}
        """Claim UID -> the record whose entries to write (prepared) or remove (unprepared)."""
        self._written: dict[str, list[Entry]] = {}
        """What each claim's entries were computed as when last written."""
        self._read: dict[str, Mapping[str, Any]] = {}
        """Claim UID -> the claim object its prepare read, for the first write (no GET)."""
        self._changed = asyncio.Event()
        self.idle = asyncio.Event()
        """Set whenever nothing is left to write (tests)."""

    def prepared(
        self,
        record: PreparedClaim,
        *,
        pods: Sequence[PodRef] | None,
        resource: Mapping[str, Any] | None = None,
    ) -> None:
        self._records[record.uid] = record
        if resource is not None:
            self._read[record.uid] = resource
        self._mark(record)

    def unprepared(self, uid: str) -> None:
        self._read.pop(uid, None)
        record = self._records.pop(uid, None)
        if record is not None:
            self._mark(record)

    def seed(self, records: Iterable[PreparedClaim]) -> None:
        """At start: the completed claims of the checkpoint, written again (health may have
        changed while the agent was down)."""
        for record in records:
            self.prepared(record, pods=None)

    def _mark(self, record: PreparedClaim) -> None:
        self._dirty[record.uid] = record
        self.idle.clear()
        self._changed.set()

    async def run(self) -> None:
        """Eternal: write dirty claims; re-check claims whose devices' health changed."""
        backoff = Backoff(initial_s=0.2, max_s=10.0)
        health_changed = self._board.changed()
        while True:
            self._changed.clear()
            if health_changed.is_set():
                health_changed = self._board.changed()
                self._mark_health_changes()
            try:
                await self._flush()
            except RecoverableError as exc:
                delay = backoff.next_delay()
                log.warning("device_status_write_failed", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            if not self._dirty:
                self.idle.set()
            await _first(self._changed.wait(), health_changed.wait())

    def _health(self) -> dict[str, DeviceHealthView]:
        return {view.device: view for view in self._board.snapshot()}

    def _entries(
        self, record: PreparedClaim, health: Mapping[str, DeviceHealthView]
    ) -> list[Entry]:
        return entries(record, node=self._node, inventory=self._inventory.current, health=health)

    def _mark_health_changes(self) -> None:
        health = self._health()
        for uid, record in self._records.items():
            written = self._written.get(uid)
            if written is not None and written != self._entries(record, health):
                self._mark(record)

    async def _flush(self) -> None:
        health = self._health()
        for uid in sorted(self._dirty):
            if self._quiet is not None:
                await self._quiet()
            record = self._dirty.pop(uid)
            wanted = self._entries(record, health) if uid in self._records else []
            try:
                await self._write(record, wanted)
            except RecoverableError:
                self._dirty.setdefault(uid, record)
                raise
            if uid in self._records:
                self._written[uid] = wanted
            else:
                self._written.pop(uid, None)

    async def _write(self, record: PreparedClaim, wanted: list[Entry]) -> None:
        """Read, merge, PUT; again on a conflict. Gone, replaced or refused: left alone."""
        read = self._read.pop(record.uid, None)
        for _ in range(_CONFLICT_ATTEMPTS):
            if read is not None:
                # As the prepare read it: a change since then makes the PUT conflict, and the
                # next attempt reads the claim.
                claim, read = dict(read), None
            else:
                try:
                    claim = await self._kube.get(
                        RESOURCE_CLAIMS, record.name, namespace=record.namespace
                    )
                except KubeNotFoundError:
                    return
                except KubeError as exc:
                    log.warning("device_status_refused", claim_uid=record.uid, error=str(exc))
                    return
            if (claim.get("metadata") or {}).get("uid") != record.uid:
                return
            status = claim.get("status") or {}
            if not status.get("allocation"):
                return  # deallocated: the API server dropped every entry
            devices = merge(claim, wanted, driver=self._driver, now=_rfc3339(self._clock()))
            if devices == (status.get("devices") or []):
                return
            if devices:
                claim["status"] = {**status, "devices": devices}
            else:
                claim["status"] = {k: v for k, v in status.items() if k != "devices"}
            try:
                await self._kube.replace(
                    RESOURCE_CLAIMS, claim, namespace=record.namespace, subresource="status"
                )
            except KubeConflictError:
                continue
            except KubeNotFoundError:
                return
            except KubeError as exc:
                log.warning("device_status_refused", claim_uid=record.uid, error=str(exc))
                return
            log.debug("device_status_written", claim_uid=record.uid, devices=len(wanted))
            return
        raise KubeConflictError(f"update status of resourceclaim {record.namespace}/{record.name}")


async def _first(*waits: Any) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
