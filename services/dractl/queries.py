"""What dractl asks the bus: inventory, device health, fault injection, drains, alerts."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import api

from shared.bus import codec
from shared.bus.connection import Bus
from shared.errors import BusUnavailableError, DraSuiteError, MalformedMessageError
from shared.pb.drasuite.v1 import alert_pb2, health_pb2, inventory_pb2

__all__ = ["CommandError", "alerts", "drain", "health", "inject_fault", "inventory"]


class CommandError(DraSuiteError):
    """A dractl command that cannot do what was asked; printed without a traceback."""


def _device_of(key: str, prefix: str) -> str:
    """The device of a health key under `prefix` (`<driver>.<node>.`), or ""."""
    device = key.removeprefix(prefix)
    return device if device != key and "." not in device else ""


def _to_stderr(exc: MalformedMessageError) -> None:
    print(f"dractl: skipped: {exc}", file=sys.stderr, flush=True)


async def inventory(bus: Bus, *, driver: str, node: str) -> inventory_pb2.Inventory:
    key = bus.names.inventory_key(driver, node)
    data = await bus.kv_get(bus.names.inventory_bucket, key)
    if data is None:
        raise CommandError(f"no inventory for driver {driver} on node {node}")
    return codec.decode(inventory_pb2.Inventory, data, subject=key)


async def health(
    bus: Bus,
    *,
    driver: str,
    node: str,
    skipped: Callable[[MalformedMessageError], None] = _to_stderr,
) -> list[health_pb2.DeviceHealth]:
    """The node's health records; one that does not decode is reported to `skipped`."""
    kv = await bus.kv(bus.names.health_bucket)
    prefix = bus.names.health_key(driver, node, "")
    try:
        # Not `keys(filters=...)`: nats-py matches those as substrings, not as subjects.
        keys = [key for key in await kv.keys() if _device_of(key, prefix)]
    except nats.js.errors.NoKeysError:
        return []
    records = []
    for key in sorted(keys):
        data = await bus.kv_get(bus.names.health_bucket, key)
        if data is None:
            continue
        try:
            records.append(codec.decode(health_pb2.DeviceHealth, data, subject=key))
        except MalformedMessageError as exc:  # the other devices' records still count
            skipped(exc)
    return records


async def inject_fault(
    bus: Bus, *, driver: str, node: str, command: health_pb2.FaultCommand
) -> dict[str, Any]:
    subject = bus.names.fault_control(driver, node)
    try:
        reply = await bus.request(subject, codec.encode(command), timeout_s=5.0)
    except BusUnavailableError as exc:
        raise CommandError(f"no health agent answered on {subject}: {exc}") from exc
    answer: dict[str, Any] = json.loads(reply.data)
    if not answer.get("ok"):
        raise CommandError(f"fault command refused: {answer.get('error', 'unknown error')}")
    return answer


async def drain(
    bus: Bus, *, driver: str, node: str, device: str, drain: bool, reason: str = ""
) -> dict[str, Any]:
    """Drain (or undrain) `device` through the node's health agent; its reply."""
    subject = bus.names.drain_control(driver, node)
    request = {"device": device, "drain": drain, "reason": reason}
    try:
        reply = await bus.request(subject, json.dumps(request).encode(), timeout_s=5.0)
    except BusUnavailableError as exc:
        raise CommandError(f"no health agent answered on {subject}: {exc}") from exc
    answer: dict[str, Any] = json.loads(reply.data)
    if not answer.get("ok"):
        raise CommandError(f"drain refused: {answer.get('error', 'unknown error')}")
    return answer


async def alerts(
    bus: Bus,
    *,
    follow: bool,
    last: int,
    skipped: Callable[[MalformedMessageError], None] = _to_stderr,
) -> AsyncIterator[alert_pb2.Alert]:
    """The last `last` alerts of the stream, then (with `follow`) new ones as they arrive.

    A message that is not an alert is reported to `skipped` and passed over.
    """
    stream = bus.names.alerts_stream
    try:
        info = await bus.js.stream_info(stream)
    except nats.js.errors.NotFoundError as exc:
        raise CommandError(f"alert stream {stream} does not exist yet") from exc
    start = max(info.state.first_seq, info.state.last_seq - last + 1)
    subscription = await bus.js.subscribe(
        bus.names.alerts_wildcard,
        stream=stream,
        ordered_consumer=True,
        config=api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start
        ),
    )
    try:
        pending = info.state.last_seq - start + 1 if info.state.messages else 0
        while follow or pending > 0:
            try:
                msg = await subscription.next_msg(timeout=3600 if follow else 2.0)
            except nats.errors.TimeoutError:
                if follow:
                    continue
                return
            pending -= 1
            try:
                alert = codec.decode_json(alert_pb2.Alert, msg.data, subject=msg.subject)
            except MalformedMessageError as exc:  # one bad message must not end the listing
                skipped(exc)
                continue
            yield alert
    finally:
        await subscription.unsubscribe()
