"""Ending a node's live connections, through nats-server's system account.

The service's SYS user (`dra-nats-auth-sys`, allowed `$SYS.REQ.SERVER.*.CONNZ` and `.KICK`
only) asks every server for the app account's connections of each node role of the node
(connz `user` is the user JWT's name, `<role>/<node>`), then kicks each by its client id on the
server that holds it. The kicked agents reconnect and meet the callout, which refuses them.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from services.natsauth.identity import AGENT_ROLES
from shared.bus.connection import Bus
from shared.errors import BusUnavailableError

__all__ = ["Connection", "Kicker"]

_PAGE = 1024
_FIRST_REPLY_S = 2.0
_MORE_REPLIES_S = 0.25
"""After the first server's answer, how long the others of a cluster get."""


@dataclass(frozen=True, slots=True)
class Connection:
    server: str
    cid: int
    user: str


class Kicker:
    def __init__(self, bus: Bus, *, account: str) -> None:
        self._bus = bus
        self._account = account

    async def end_node(self, node: str) -> list[Connection]:
        """Kick every connection of `node`'s agents; those kicked. Raises BusUnavailableError."""
        # The roles asked at once: each ask waits a moment for the other servers' answers.
        users = [f"{role}/{node}" for role in sorted(AGENT_ROLES.values())]
        found = [c for page in await asyncio.gather(*map(self.find, users)) for c in page]
        await asyncio.gather(*(
            self._request(f"$SYS.REQ.SERVER.{c.server}.KICK", {"cid": c.cid}) for c in found
        ))  # fmt: skip
        return found

    async def find(self, user: str) -> list[Connection]:
        query = {"acc": self._account, "user": user, "auth": True, "limit": _PAGE}
        found: list[Connection] = []
        for answer in await self._gather("$SYS.REQ.SERVER.PING.CONNZ", query):
            server = str(answer.get("server", {}).get("id", ""))
            data = answer.get("data") or {}
            found += _connections(server, data, user, self._account)
            offset = len(data.get("connections") or [])
            while server and offset < int(data.get("total", 0)):
                data = await self._request(
                    f"$SYS.REQ.SERVER.{server}.CONNZ", {**query, "offset": offset}
                )
                page = _connections(server, data, user, self._account)
                if not page:
                    break
                found += page
                offset += len(data.get("connections") or [])
        return found

    async def _request(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        reply = await self._bus.request(subject, json.dumps(body).encode(), timeout_s=2.0)
        answer = json.loads(reply.data)
        if "error" in answer:
            raise BusUnavailableError(f"{subject}: {answer['error']}", subject=subject)
        return dict(answer.get("data") or {})

    async def _gather(self, subject: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """Every server's answer to a PING request (one per server of a cluster)."""
        try:
            return await self._gather_once(subject, body)
        except nats.errors.Error as exc:
            raise BusUnavailableError(f"{subject}: {exc}", subject=subject) from exc

    async def _gather_once(self, subject: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        nc = self._bus.nc
        answers: asyncio.Queue[Msg] = asyncio.Queue()
        inbox = nc.new_inbox()

        async def collect(msg: Msg) -> None:
            answers.put_nowait(msg)

        sub = await nc.subscribe(inbox, cb=collect)
        try:
            await nc.publish(subject, json.dumps(body).encode(), reply=inbox)
            got = [await asyncio.wait_for(answers.get(), _FIRST_REPLY_S)]
            await asyncio.sleep(_MORE_REPLIES_S)
            while not answers.empty():
                got.append(answers.get_nowait())
        except TimeoutError as exc:
            raise BusUnavailableError(f"{subject}: no server answered", subject=subject) from exc
        finally:
            await sub.unsubscribe()
        parsed = [json.loads(msg.data) for msg in got]
        for answer in parsed:
            if "error" in answer:
                raise BusUnavailableError(f"{subject}: {answer['error']}", subject=subject)
        return parsed


def _connections(server: str, data: dict[str, Any], user: str, account: str) -> list[Connection]:
    # Filtered again here: the filter is the server's, but what we kick is ours to get right.
    return [
        Connection(server=server, cid=int(conn["cid"]), user=user)
        for conn in data.get("connections") or []
        if conn.get("authorized_user") == user and conn.get("account") == account
    ]
