"""Keeping the revocation list in force: poll it, refuse its nodes, end their connections.

Every replica reads the list itself (`RevocationStore`, every `poll_s`), so each refuses a
revoked node at its next connect however the list changed. A node newly revoked has its cached
reviews dropped and its live connections kicked (`Kicker`), twice: once when seen and once a
poll later, for a connect that this replica admitted while it was learning of the revocation.
Another replica kicks what it admitted when it learns in turn. An entry whose `until` passed,
or which an operator removed, lets the node back at its next connect. Until the first read has
succeeded the service does not answer callouts (`loaded`): it cannot tell who is revoked.

The quota auditor revokes without waiting for the list (`revoke_now`): the node is refused and
kicked at once, and its entry is kept in force here until it is on the list (`unpin`) or a read
of the list shows it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

import structlog

from services.natsauth import instruments, revocations
from services.natsauth.revocations import Revocation
from services.natsauth.syskick import Connection
from shared.errors import DraSuiteError

__all__ = ["Revoker"]

log = structlog.get_logger(__name__)
_SWEEPS = 2


class Revoker:
    def __init__(
        self,
        *,
        read: Callable[[], Awaitable[Mapping[str, Revocation]]],
        kick: Callable[[str], Awaitable[list[Connection]]] | None,
        forget: Callable[[str], None],
        poll_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`forget` drops a node's cached reviews; without `kick` (no SYS user configured)
        live sessions last until their JWT expires."""
        self._read = read
        self._kick = kick
        self._forget = forget
        self._poll_s = poll_s
        self._clock = clock
        self._entries: Mapping[str, Revocation] = {}
        self._active: frozenset[str] = frozenset()
        self._sweeps_left: dict[str, int] = {}
        self._pinned: dict[str, Revocation] = {}
        self.loaded = asyncio.Event()

    def revoked(self, node: str) -> bool:
        entry = self._entries.get(node)
        return entry is not None and entry.active(self._clock())

    async def run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(self._poll_s)

    async def poll(self) -> None:
        try:
            entries = await self._read()
        except DraSuiteError as exc:
            log.warning("nats_revocations_unreadable", error=str(exc), loaded=self.loaded.is_set())
        else:
            for node in set(self._pinned) & set(entries):
                del self._pinned[node]  # the list has it now: it rules from here on
            self._apply({**self._pinned, **entries})
            self.loaded.set()
        await self._sweep()

    async def revoke_now(self, revocation: Revocation) -> None:
        """Put `revocation` in force in this process at once, before the list shows it, and
        end the node's connections now; a node revoked already is left as it is."""
        node = revocation.node
        if self.revoked(node):
            return
        self._pinned[node] = revocation
        self._apply({**self._entries, node: revocation})
        await self._sweep_node(node)

    def unpin(self, node: str) -> None:
        """The list has the node's entry now (written, or found there): from the next read on,
        the list alone decides, so an operator's unrevoke is followed."""
        self._pinned.pop(node, None)

    def _apply(self, entries: Mapping[str, Revocation]) -> None:
        self._entries = dict(entries)
        active = revocations.active_nodes(entries, now=self._clock())
        for node in sorted(active - self._active):
            entry = entries[node]
            self._forget(node)
            self._sweeps_left[node] = _SWEEPS
            instruments.REVOCATIONS.add(1, {"event": "revoked"})
            log.warning(
                "nats_node_revoked", node=node, reason=entry.reason, revoked_at=entry.at or None,
                until=entry.until, malformed=entry.malformed or None, security=True,
            )  # fmt: skip
        for node in sorted(self._active - active):
            self._sweeps_left.pop(node, None)
            instruments.REVOCATIONS.add(1, {"event": "unrevoked"})
            expired = node in entries
            log.warning("nats_node_unrevoked", node=node, expired=expired, security=True)
        self._active = active

    async def _sweep(self) -> None:
        if self._kick is None:
            self._sweeps_left.clear()
            return
        for node in sorted(self._sweeps_left):
            await self._sweep_node(node)

    async def _sweep_node(self, node: str) -> None:
        if self._kick is None:
            return
        try:
            kicked = await self._kick(node)
        except DraSuiteError as exc:
            log.warning("nats_revoked_node_kick_failed", node=node, error=str(exc),
                        security=True)  # fmt: skip
            return  # tried again at the next poll
        # Another sweep (the poll's, the auditor's) may have finished this node meanwhile.
        if node in self._sweeps_left:
            self._sweeps_left[node] -= 1
            if self._sweeps_left[node] <= 0:
                del self._sweeps_left[node]
        if kicked:
            instruments.REVOCATIONS.add(len(kicked), {"event": "kicked"})
            log.warning(
                "nats_revoked_node_kicked", node=node, security=True,
                connections=[f"{c.user}#{c.cid}@{c.server[:8]}" for c in kicked],
            )  # fmt: skip
