"""Making sure a stream (a KV bucket's or the alert stream) is the one its provisioner owns.

`ensure` reads the stream's config as the server reports it (raw JSON: every field, also those
nats-py does not parse), creates the stream where it is missing and updates it where it drifted
(`shared.bus.drift`). On the secured bus only the provisioner may create or update streams: an
agent's attempt is refused and times out, and then the drift decides. A stream whose owned
fields still differ raises `StreamTamperedError` (the agent exits rather than use it); one whose
only difference is a tunable field (replicas) is used as it is, with one warning per stream and
process naming the `nats` command to run. Never a delete: data stays.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import nats.errors
import structlog
from nats.aio.client import Client as NATSClient

from shared.bus import drift
from shared.bus.streams import TUNABLE, StreamTamperedError
from shared.errors import BusUnavailableError

__all__ = ["ensure", "stream_config"]

log = structlog.get_logger(__name__)

_NOT_FOUND = 10059
_GROW_ONLY = ("num_replicas", "max_consumers")


class _APIError(Exception):
    def __init__(self, code: int, description: str) -> None:
        super().__init__(description)
        self.code = code


async def _call(nc: NATSClient, subject: str, body: Mapping[str, Any] | None, *,
                timeout_s: float) -> dict[str, Any]:  # fmt: skip
    data = json.dumps(body).encode() if body is not None else b""
    try:
        reply = await nc.request(subject, data, timeout=timeout_s)
    except (nats.errors.Error, TimeoutError, OSError) as exc:
        error = str(exc) or type(exc).__name__
        raise BusUnavailableError(f"{subject}: {error}", subject=subject) from exc
    answer: dict[str, Any] = json.loads(reply.data or b"{}")
    if problem := answer.get("error"):
        code = int(problem.get("err_code") or 0)
        raise _APIError(code, str(problem.get("description") or problem))
    return answer


async def stream_config(nc: NATSClient, name: str, *, timeout_s: float) -> dict[str, Any] | None:
    """The stream's config as the server reports it; None when there is no such stream."""
    try:
        answer = await _call(nc, f"$JS.API.STREAM.INFO.{name}", None, timeout_s=timeout_s)
    except _APIError as exc:
        if exc.code == _NOT_FOUND:
            return None
        raise BusUnavailableError(f"stream info {name}: {exc}", subject=name) from exc
    return dict(answer.get("config") or {})


async def ensure(
    nc: NATSClient,
    wanted: Mapping[str, Any],
    *,
    timeout_s: float,
    reported: set[str],
    tunable: Iterable[str] = TUNABLE,
    bucket: str = "",
) -> dict[str, Any]:
    """The stream's config once it is `wanted` in every owned field (`tunable` ones may
    differ); raises StreamTamperedError, or BusUnavailableError while it cannot tell."""
    name = str(wanted["name"])
    current = await stream_config(nc, name, timeout_s=timeout_s)
    if current is None:
        current = await _create(nc, wanted, timeout_s=timeout_s)
    found = drift.drift(current, wanted, grow_only=_GROW_ONLY)
    if not found:
        return current
    error = "not changeable in place"
    if found.in_place and name not in reported:
        try:
            answer = await _call(nc, f"$JS.API.STREAM.UPDATE.{name}", found.target,
                                 timeout_s=timeout_s)  # fmt: skip
        except (_APIError, BusUnavailableError) as exc:
            error = str(exc) or type(exc).__name__
        else:
            log.info("stream_updated", stream=name, changes=found.summary())
            if "allow_direct" in found.changes and bucket:
                log.info("kv_direct_get_enabled", bucket=bucket)
            return dict(answer.get("config") or {})
    owned = found.without(tunable)
    if owned:
        log.error("stream_tampered", stream=name, changes=owned.summary(), error=error,
                  security=True)  # fmt: skip
        raise StreamTamperedError(name, owned.summary())
    if name not in reported:
        reported.add(name)
        log.warning(
            "stream_settings_differ", stream=name, changes=found.summary(), error=error,
            run=found.command(), action="run the command as a user allowed to update streams",
        )  # fmt: skip
    return current


async def _create(nc: NATSClient, wanted: Mapping[str, Any], *, timeout_s: float) -> dict[str, Any]:
    """Create the stream; where another client was first, the stream it made."""
    name = str(wanted["name"])
    try:
        answer = await _call(nc, f"$JS.API.STREAM.CREATE.{name}", wanted, timeout_s=timeout_s)
    except (_APIError, BusUnavailableError) as exc:
        existing = await stream_config(nc, name, timeout_s=timeout_s)
        if existing is None:
            raise BusUnavailableError(
                f"stream {name} is not provisioned (create: {exc})", subject=name
            ) from exc
        return existing
    return dict(answer.get("config") or {})
