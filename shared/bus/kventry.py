"""A KV entry as a watch yields it, and the checks every entry passes on its way there.

Both ways a watch hears of an entry, a consumer's delivery (`kv`) and a stream's republished
copy or a direct get (`kvfollow`), hand it to `change_of`: JetStream's own answers redirected
into a bucket are dropped, `Records.check` takes or refuses the value (a refused one reaches
only a watch of the owner's own keys, flagged `rejected`), and a delete or purge becomes a
change without a value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE

from shared import telemetry
from shared.bus import origin
from shared.bus.client import STORED

if TYPE_CHECKING:
    from shared.bus.connection import Bus

__all__ = ["STREAM_HEADERS", "SYNCED", "KVChange", "change_of", "dropped", "stored_headers"]

STREAM_HEADERS = frozenset(
    {"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending",
     "Nats-Last-Sequence", "Nats-UpTo-Sequence"}
)  # fmt: skip
"""The headers JetStream adds to a stored message when it sends it by direct get or republish."""
_MARKER_REASON = "Nats-Marker-Reason"

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class KVChange:
    key: str
    # None when the key was deleted or purged.
    value: bytes | None
    revision: int
    # True on the marker that ends the replay of current values after each (re)start.
    synced: bool = False
    # The writer's W3C trace-context headers (only those; `telemetry.carried`).
    trace: telemetry.Carrier = ()
    # True for a current value replayed after a (re)start, not a change seen as it happened.
    replayed: bool = False
    # Why the entry was refused (`shared.bus.signing.REASONS`); only for `watch(rejected=True)`,
    # whose caller owns the key and puts its value back. `value` is then None.
    rejected: str = ""
    # True when the entry was signed by its key's owner (signatures on).
    signed: bool = False


SYNCED = KVChange(key="", value=None, revision=0, synced=True)


def change_of(
    bus: Bus,
    *,
    subject: str,
    key: str,
    data: bytes,
    headers: Mapping[str, str],
    revision: int,
    stored_at: float | None,
    replayed: bool,
    rejected: bool,
) -> KVChange | None:
    """The change an entry stored on `subject` (`key` of its bucket) makes; None when it is
    dropped. `headers` are the stored message's own (none JetStream added on the way)."""
    if origin.is_jetstream_reply(reply="", headers=headers, data=data):
        dropped(subject, reason="jetstream_reply")
        if rejected and bus.records.owns(subject):
            return KVChange(key=key, value=None, revision=revision, rejected="jetstream_reply")
        return None
    check = bus.records.check(subject, data, headers, stored_at=stored_at)
    if not check.ok:
        if rejected:
            return KVChange(key=key, value=None, revision=revision, rejected=check.reason)
        return None
    if rejected and check.writer is None and bus.records.on and bus.records.resign(subject):
        # Taken unsigned (accept mode: written before this agent signed): its owner signs it.
        return KVChange(key=key, value=None, revision=revision, rejected="unsigned")
    operation = headers.get(KV_OP) or (
        KV_PURGE if headers.get(_MARKER_REASON) in ("MaxAge", "Purge", "Remove") else None
    )
    deleted = operation in (KV_DEL, KV_PURGE)
    return KVChange(
        key=key,
        value=None if deleted else data,
        revision=revision,
        trace=telemetry.carried(headers),
        replayed=replayed,
        signed=check.writer is not None,
    )


def stored_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers a stored message was stored with, from those JetStream sent it with (by
    direct get or republish): its own added ones set aside, and a value it repeated, which the
    stored message carried too, given back (`shared.bus.client.STORED`)."""
    stored = {
        k: v for k, v in headers.items() if k not in STREAM_HEADERS and not k.startswith(STORED)
    }
    for name, value in headers.items():
        if name.startswith(STORED):
            stored[name.removeprefix(STORED)] = value
    return stored


def dropped(subject: str, *, reason: str) -> None:
    log.warning("kv_entry_dropped", subject=subject, reason=reason, security=True)
