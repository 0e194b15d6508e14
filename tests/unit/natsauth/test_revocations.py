"""The revocation list: parsing fails closed, `--until` ends it, the Revoker applies it."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from services.natsauth import revocations
from services.natsauth.revocations import Revocation
from services.natsauth.revokecli import parse_until
from services.natsauth.revoker import Revoker
from services.natsauth.syskick import Connection
from shared.errors import BusUnavailableError, ConfigError

NOW = 1_800_000_000.0


def test_an_entry_round_trips_and_an_unreadable_one_revokes_for_good():
    entry = Revocation(node="node-a", until=NOW + 60, reason="stolen", at="2027-01-15T08:00:00Z")
    parsed = revocations.parse({"node-a": revocations.encode(entry), "node-b": "{not json"})
    assert parsed["node-a"] == entry
    assert parsed["node-b"].malformed
    assert revocations.active_nodes(parsed, now=NOW) == {"node-a", "node-b"}
    assert revocations.active_nodes(parsed, now=NOW + 60) == {"node-b"}


def test_until_takes_a_duration_or_a_zoned_time_in_the_future():
    assert parse_until("", now=NOW) is None
    assert parse_until("90m", now=NOW) == NOW + 5400
    assert parse_until("2027-01-16T00:00:00Z", now=NOW) == 1_800_057_600.0
    for bad in ("soon", "2027-01-16T00:00:00", "2020-01-01T00:00:00Z"):
        with pytest.raises(ConfigError):
            parse_until(bad, now=NOW)


class _World:
    """The Revoker's seams: the list as a dict, kicks and forgotten nodes recorded."""

    def __init__(self) -> None:
        self.now = NOW
        self.entries: dict[str, Revocation] = {}
        self.kicked: list[str] = []
        self.forgotten: list[str] = []
        self.kick_fails = False

    async def read(self) -> Mapping[str, Revocation]:
        return dict(self.entries)

    async def kick(self, node: str) -> list[Connection]:
        if self.kick_fails:
            raise BusUnavailableError("no sys connection")
        self.kicked.append(node)
        return [Connection(server="S", cid=1, user=f"health/{node}")]


async def test_a_revocation_is_forgotten_kicked_twice_and_ends_at_until():
    world = _World()
    revoker = Revoker(read=world.read, kick=world.kick, forget=world.forgotten.append,
                      poll_s=1, clock=lambda: world.now)  # fmt: skip
    await revoker.poll()
    assert revoker.loaded.is_set()
    assert not revoker.revoked("node-a")
    world.entries["node-a"] = Revocation(node="node-a", until=NOW + 10)
    world.kick_fails = True
    await revoker.poll()
    assert revoker.revoked("node-a")
    assert world.forgotten == ["node-a"]
    world.kick_fails = False  # retried until two sweeps succeed
    for _ in range(3):
        await revoker.poll()
    assert world.kicked == ["node-a", "node-a"]
    world.now = NOW + 10
    assert not revoker.revoked("node-b")
    assert not revoker.revoked("node-a")


async def test_nobody_is_admitted_before_the_list_is_read():
    async def unreadable() -> Mapping[str, Revocation]:
        raise BusUnavailableError("api server down")

    revoker = Revoker(read=unreadable, kick=None, forget=lambda node: None, poll_s=1)
    await revoker.poll()
    assert not revoker.loaded.is_set()
