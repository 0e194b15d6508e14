"""The quota auditor: every node's keys and bytes in the buckets, and what goes over its quota.

Each replica of the auth service watches the three buckets from the start (so a restart
counts them anew from what the buckets hold) through a connection of its own, admitted by
its own callout with a token only this process knows, as `auditor@<replica>`: it may create
and delete exactly its consumers `auditor-<replica>-watch` (every key of a bucket) and write
delete markers in the health and claims buckets, nothing else (`permissions`). The counts are
the `QuotaLedger`'s. An entry that takes its node over its quota (`quota`) is handed to
`exceeded` (the enforcer revokes the node) and deleted: a KV delete marker, the only removal
the buckets allow (`deny_purge`, `deny_delete`); with one value per key it replaces the
value, and it expires after `MARKER_TTL_S` like every other. The marker expects the entry's
stream sequence (`Nats-Expected-Last-Subject-Sequence`), so of the replicas that delete the
same entry exactly one succeeds, and a newer value of the key is never deleted in its place
(it is judged when it arrives).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import secrets
from collections.abc import Callable

import nats.errors
import nats.js.errors
import structlog
from nats.js.kv import KV_DEL, KV_OP

from services.natsauth import instruments, quota
from services.natsauth.permissions import AUDITOR
from services.natsauth.quotaledger import Excess, QuotaLedger
from shared.bus import kv, streams
from shared.bus.connection import Bus
from shared.bus.streams import StreamTamperedError
from shared.config import NATSSettings
from shared.errors import BusUnavailableError

__all__ = ["DELETES_IN_FLIGHT", "QuotaAuditor"]

log = structlog.get_logger(__name__)
DELETES_IN_FLIGHT = 64
_WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a publish whose expected last subject sequence is not the key's."""
_TAMPERED_PAUSE_S = 5.0


class QuotaAuditor:
    def __init__(self, settings: NATSSettings, *, exceeded: Callable[[Excess], None]) -> None:
        """`exceeded` is called (in the watch's task: it must not block) for each entry over
        a quota, before that entry is deleted."""
        self.replica = secrets.token_hex(4)
        self.token = secrets.token_urlsafe(32)
        self.settings = dataclasses.replace(
            settings, user="", password="", password_file="", token=self.token, token_file="",
            nkey_seed_file="", creds_file="", bus_signatures="off", bus_auth_key_file="",
        )  # fmt: skip
        self.bus = Bus(self.settings, name="dra-nats-auth-auditor", component=AUDITOR,
                       node=self.replica)  # fmt: skip
        self.ledger = QuotaLedger()
        self.synced = asyncio.Event()
        """Set once every bucket was counted from its start."""
        self._exceeded = exceeded
        self._unsynced = set(self.bus.names.buckets)
        self._deleting = asyncio.Semaphore(DELETES_IN_FLIGHT)
        self._deletes: set[asyncio.Task[None]] = set()

    def admits(self, token: str) -> str:
        """This replica's id when `token` is the auditor's own, "" otherwise."""
        return self.replica if hmac.compare_digest(token.encode(), self.token.encode()) else ""

    async def run(self) -> None:
        """Eternal: keep the connection and a watch of each bucket."""
        connector = asyncio.create_task(self.bus.run(), name="auditor-connector")
        try:
            async with asyncio.TaskGroup() as group:
                for bucket in self.bus.names.buckets:
                    group.create_task(self._audit(bucket), name=f"audit-{bucket}")
        finally:
            for task in self._deletes:
                task.cancel()
            await asyncio.gather(*self._deletes, return_exceptions=True)
            await self.bus.close()
            connector.cancel()
            await asyncio.gather(connector, return_exceptions=True)

    async def _audit(self, bucket: str) -> None:
        while True:
            try:
                await self._watch(bucket)
            except StreamTamperedError as exc:
                # The provisioner brings it back; until then this bucket is not counted.
                log.warning("bus_quota_audit_paused", bucket=bucket, error=str(exc),
                            security=True)  # fmt: skip
                await asyncio.sleep(_TAMPERED_PAUSE_S)

    async def _watch(self, bucket: str) -> None:
        replaying = False
        async for change in kv.watch(self.bus, bucket=bucket, keys=">"):
            if change.synced:
                if not replaying:
                    self.ledger.forget(bucket)  # the replay was empty: so is the bucket
                replaying = False
                self._unsynced.discard(bucket)
                if not self._unsynced:
                    self.synced.set()
                continue
            if change.replayed and not replaying:
                self.ledger.forget(bucket)  # a (re)start replays every key: count anew
                replaying = True
            size = None if change.value is None else len(change.value)
            excess = self.ledger.observe(bucket, change.key, size, change.revision)
            if excess is not None:
                self._exceeded(excess)
                self._spawn_delete(excess)

    def _spawn_delete(self, excess: Excess) -> None:
        task = asyncio.create_task(self._delete(excess), name="quota-delete")
        self._deletes.add(task)
        task.add_done_callback(self._deletes.discard)

    async def _delete(self, excess: Excess) -> None:
        subject = self.bus.names.kv_subject(excess.bucket, excess.key)
        headers = {
            KV_OP: KV_DEL,
            "Nats-TTL": f"{streams.MARKER_TTL_S}s",
            "Nats-Expected-Last-Subject-Sequence": str(excess.revision),
        }
        async with self._deleting:
            try:
                await self.bus.js.publish(subject, b"", headers=headers)
            except nats.js.errors.APIError as exc:
                if exc.err_code != _WRONG_LAST_SEQUENCE:
                    log.warning("bus_quota_delete_failed", subject=subject, error=str(exc))
                return  # another replica deleted it, or a newer value is judged on its own
            except (nats.errors.Error, TimeoutError, BusUnavailableError) as exc:
                # The next replay (after a reconnect) finds the entry over the quota again.
                log.warning("bus_quota_delete_failed", subject=subject, error=str(exc))
                return
        instruments.QUOTA_KEYS_DELETED.add(1, {"bucket": quota.base_bucket(excess.bucket)})
