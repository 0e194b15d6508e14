"""Bringing an existing stream (a KV bucket's or the alert stream) to the settings wanted.

Where the drift (`shared.bus.drift`) can be fixed in place and this identity may update
streams (the open bus), the stream is updated. Otherwise (an authenticated agent may create
streams, never update them; a setting NATS cannot change in place) one warning per stream and
process names the `nats` command to run, and the stream is used as it is. Never a delete.
"""

from __future__ import annotations

from collections.abc import Mapping

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext, api

from shared.bus import drift
from shared.bus.subjects import Names

__all__ = ["MAX_CONSUMERS", "converge", "kv_stream"]

log = structlog.get_logger(__name__)

_FAILED = (nats.errors.Error, nats.js.errors.Error, TimeoutError, OSError)

MAX_CONSUMERS = 1_000_000
"""Consumers a bucket or the alert stream may hold. nats-server 2.15 enforces 1,000 on a stream
that sets none (nats-py's KV create sets none), and every node watches its keys with its own
consumers (two per node on the inventory bucket): 500 nodes would be the ceiling."""


def kv_stream(bucket: str, *, history: int, replicas: int) -> api.StreamConfig:
    """The stream of a KV bucket, as nats-py's `create_key_value` makes it, with direct gets
    (the key is in the API subject: a permission can allow it) and MAX_CONSUMERS."""
    return api.StreamConfig(
        name=Names.kv_stream(bucket),
        subjects=[Names.kv_subject(bucket, ">")],
        allow_direct=True,
        allow_rollup_hdrs=True,
        allow_msg_ttl=True,
        deny_delete=True,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=120.0,
        max_consumers=MAX_CONSUMERS,
        max_msgs=-1,
        max_msgs_per_subject=history,
        num_replicas=replicas,
        storage=api.StorageType.FILE,
    )


async def converge(
    js: JetStreamContext,
    current: api.StreamConfig,
    wanted: Mapping[str, object],
    *,
    reported: set[str],
    bucket: str = "",
) -> api.StreamConfig:
    """The stream's config after the update, or `current` where none was made. `reported`
    holds the streams already logged (or refused) by this process: no second attempt."""
    found = drift.drift(current, wanted)
    if not found:
        return current
    name = found.stream
    error = "" if found.in_place else "not changeable in place"
    if found.in_place and name not in reported:
        try:
            info = await js.update_stream(found.updated(current))
        except _FAILED as exc:
            error = str(exc) or type(exc).__name__
        else:
            log.info("stream_updated", stream=name, changes=found.summary())
            if "allow_direct" in found.changes and bucket:
                log.info("kv_direct_get_enabled", bucket=bucket)
            return info.config
    if name not in reported:
        reported.add(name)
        log.warning(
            "stream_settings_differ",
            stream=name,
            changes=found.summary(),
            error=error,
            run=found.command() if found.in_place else "",
            action="run the command as a user allowed to update streams"
            if found.in_place
            else "back up the stream, then restore it with the wanted settings",
        )
    return current
