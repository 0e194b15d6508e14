"""What dractl asks the bus: inventory, device health, prepared claims, faults, drains, alerts.

Read-only commands only bind to buckets and streams, never create them: a bucket that does
not exist means "no data yet". A node or driver that has no inventory does not exist as far
as the bus knows, and says so (NoSuchNodeError) instead of answering with an empty table.
The commands share these questions (`claims` asks for health, `health` for the inventory),
and tests and benchmarks ask them directly. NATS itself is reached through `shared.bus`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from google.protobuf.message import Message

from shared import telemetry
from shared.bus import codec, reading
from shared.bus.connection import Bus
from shared.bus.reading import ReadOnlyBucket, StreamMessage
from shared.bus.subjects import token
from shared.errors import (
    BusUnavailableError,
    DraSuiteError,
    MalformedMessageError,
    ReplyRefusedError,
)
from shared.pb.drasuite.v1 import alert_pb2, claim_pb2, health_pb2, inventory_pb2

__all__ = [
    "CommandError",
    "NoDataError",
    "NoSuchNodeError",
    "alerts",
    "check_key",
    "claims",
    "drain",
    "health",
    "inject_fault",
    "inventory",
    "to_stderr",
]

M = TypeVar("M", bound=Message)
_tracer = telemetry.tracer(__name__)
# How many known nodes a "no such node" message names.
_NAMED_NODES = 10
_CONTROL_TIMEOUT_S = 5.0
_STREAM_POLL_S = 1.0


class CommandError(DraSuiteError):
    """A dractl command that cannot do what was asked; printed without a traceback."""


class NoDataError(CommandError):
    """Nothing was published on this bus yet (the bucket or stream does not exist)."""


class NoSuchNodeError(CommandError):
    """The bus knows no inventory for this node, or for this driver at all."""


def to_stderr(exc: MalformedMessageError) -> None:
    print(f"dractl: skipped: {exc}", file=sys.stderr, flush=True)


async def _decode_all(
    kv: ReadOnlyBucket,
    keys: list[str],
    kind: type[M],
    skipped: Callable[[MalformedMessageError], None],
) -> list[M]:
    messages = []
    for key in keys:
        data = await kv.value(key)
        if not data:
            continue
        try:
            message = codec.decode(kind, data, subject=key)
            check_key(message, key)
        except MalformedMessageError as exc:  # the other keys' values still count
            skipped(exc)
            continue
        messages.append(message)
    return messages


def check_key(message: Message, key: str) -> None:
    """A value must name the driver and node of the key it sits under: anyone who may write
    one node's key must not be able to show data for another node."""
    driver, node = getattr(message, "driver", ""), getattr(message, "node", "")
    tokens = key.split(".")
    if tokens[:2] != [token(driver), token(node)]:
        raise MalformedMessageError(
            f"{key}: names driver {driver!r} and node {node!r}, not those of its key",
            subject=key,
        )


async def _known_nodes(kv: ReadOnlyBucket, driver: str) -> list[str]:
    """The nodes with an inventory for `driver`, by name (decoded from a few values)."""
    prefix = f"{token(driver)}."
    keys = [key for key in await kv.keys() if key.startswith(prefix)]
    named = await _decode_all(kv, keys[:_NAMED_NODES], inventory_pb2.Inventory, lambda _: None)
    return [inv.node for inv in named] + (["..."] if len(keys) > _NAMED_NODES else [])


async def inventory(bus: Bus, *, driver: str, node: str) -> inventory_pb2.Inventory:
    """The node's inventory; NoDataError / NoSuchNodeError when the bus has none."""
    bucket = bus.names.inventory_bucket
    kv = await reading.bind_bucket(bus, bucket)
    if kv is None:
        raise NoDataError(
            f"no data yet: no agent has published an inventory on this bus (no bucket {bucket})"
        )
    key = bus.names.inventory_key(driver, node)
    data = await kv.value(key)
    if not data:
        nodes = await _known_nodes(kv, driver)
        if not nodes:
            raise NoSuchNodeError(f"no such driver: {driver} (no node publishes for it)")
        raise NoSuchNodeError(
            f"no such node: {node} for driver {driver} (nodes: {', '.join(nodes)})"
        )
    inv = codec.decode(inventory_pb2.Inventory, data, subject=key)
    try:
        check_key(inv, key)
    except MalformedMessageError as exc:
        raise CommandError(f"inventory of {node} not shown: {exc}") from exc
    return inv


async def health(
    bus: Bus,
    *,
    driver: str,
    node: str,
    skipped: Callable[[MalformedMessageError], None] = to_stderr,
) -> list[health_pb2.DeviceHealth]:
    """The node's health records; none for a node the bus does not know is NoSuchNodeError."""
    kv = await reading.bind_bucket(bus, bus.names.health_bucket)
    keys = bus.names.health_keys(driver, node)
    records = await _node_values(kv, keys, health_pb2.DeviceHealth, skipped) if kv else []
    if not records:
        await inventory(bus, driver=driver, node=node)  # raises unless the node exists
    return records


async def claims(
    bus: Bus,
    *,
    driver: str,
    node: str | None,
    skipped: Callable[[MalformedMessageError], None] = to_stderr,
) -> list[claim_pb2.PreparedClaim]:
    """Claims prepared on `node`, or on every node of `driver`; none for a node the bus does
    not know is NoSuchNodeError."""
    kv = await reading.bind_bucket(bus, bus.names.claims_bucket)
    keys = bus.names.claim_keys(driver, node) if node else f"{token(driver)}.*.*"
    prepared = await _node_values(kv, keys, claim_pb2.PreparedClaim, skipped) if kv else []
    if not prepared and node is not None:
        await inventory(bus, driver=driver, node=node)  # raises unless the node exists
    elif not prepared:
        await _require_driver(bus, driver)
    return prepared


async def _require_driver(bus: Bus, driver: str) -> None:
    kv = await reading.bind_bucket(bus, bus.names.inventory_bucket)
    if kv is None:
        raise NoDataError(
            "no data yet: no agent has published an inventory on this bus "
            f"(no bucket {bus.names.inventory_bucket})"
        )
    if not await _known_nodes(kv, driver):
        raise NoSuchNodeError(f"no such driver: {driver} (no node publishes for it)")


async def _node_values(
    kv: ReadOnlyBucket,
    filter_: str,
    kind: type[M],
    skipped: Callable[[MalformedMessageError], None],
) -> list[M]:
    # Not `keys(filters=...)`: nats-py matches those as substrings, not as subjects.
    keys = [key for key in await kv.keys() if _matches(key, filter_)]
    return await _decode_all(kv, keys, kind, skipped)


def _matches(key: str, filter_: str) -> bool:
    """A KV key against a filter of literal tokens and `*` (one token each)."""
    tokens, wanted = key.split("."), filter_.split(".")
    return len(tokens) == len(wanted) and all(
        w in ("*", t) for t, w in zip(tokens, wanted, strict=True)
    )


async def _control(bus: Bus, subject: str, data: bytes, *, what: str) -> dict[str, Any]:
    try:
        reply = await bus.request(subject, data, timeout_s=_CONTROL_TIMEOUT_S)
    except BusUnavailableError as exc:
        raise CommandError(
            f"no health agent answered on {subject} (is the node name right?): {exc}"
        ) from exc
    except ReplyRefusedError as exc:
        raise CommandError(f"{what}: {exc}") from exc
    try:
        answer: dict[str, Any] = json.loads(reply.data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CommandError(f"{what}: the health agent's answer is not JSON") from exc
    if not isinstance(answer, dict) or not answer.get("ok"):
        error = answer.get("error", "unknown error") if isinstance(answer, dict) else answer
        raise CommandError(f"{what} refused: {error}")
    return answer


async def _stream_appeared(bus: Bus, stream: str) -> reading.StreamState:
    while True:
        await asyncio.sleep(_STREAM_POLL_S)
        state = await reading.stream_state(bus, stream)
        if state is not None:
            return state


async def inject_fault(
    bus: Bus, *, driver: str, node: str, command: health_pb2.FaultCommand
) -> dict[str, Any]:
    subject = bus.names.fault_control(driver, node)
    return await _control(bus, subject, codec.encode(command), what="fault command")


async def drain(
    bus: Bus, *, driver: str, node: str, device: str, drain: bool, reason: str = ""
) -> dict[str, Any]:
    """Drain (or undrain) `device` through the node's health agent; its reply."""
    subject = bus.names.drain_control(driver, node)
    request = {"device": device, "drain": drain, "reason": reason}
    return await _control(bus, subject, json.dumps(request).encode(), what="drain")


async def alerts(
    bus: Bus,
    *,
    follow: bool,
    last: int,
    skipped: Callable[[MalformedMessageError], None] = to_stderr,
) -> AsyncIterator[alert_pb2.Alert]:
    """The last `last` alerts of the stream, then (with `follow`) new ones as they arrive.

    A message that is not an alert is reported to `skipped` and passed over. The health agent
    creates the stream with its first alert: on a bus where agents published (an inventory
    bucket exists) a missing stream is no alerts (`follow` waits for it to appear); on a bus
    where nothing was published it is NoDataError. Binding only: dractl never creates it.
    """
    stream = bus.names.alerts_stream
    state = await reading.stream_state(bus, stream)
    if state is None:
        if await reading.bind_bucket(bus, bus.names.inventory_bucket) is None:
            raise NoDataError(f"no alerts yet (no stream {stream} on this bus)")
        if not follow:
            return
        state = await _stream_appeared(bus, stream)
    start = max(state.first_seq, state.last_seq - last + 1)
    async with reading.read_stream(
        bus, stream=stream, subjects=bus.names.alerts_wildcard, start_seq=start
    ) as reader:
        pending = state.last_seq - start + 1 if state.messages else 0
        while follow or pending > 0:
            msg = await reader.next(timeout_s=3600 if follow else 2.0)
            if msg is None:
                if follow:
                    continue
                return
            pending -= 1
            # A live alert continues the health agent's trace; one of the listing links to it.
            # The span covers reading the alert only, not what the caller does with it.
            with telemetry.continued(
                _tracer,
                "dractl.alert_read",
                telemetry.carried(msg.headers),
                linked=pending >= 0,
                attributes={"subject": msg.subject},
            ) as span:
                alert = _alert(msg, skipped)
                if span is not None and alert is not None:
                    span.set_attributes(
                        {"alert_id": alert.id, "node": alert.node, "device": alert.device}
                    )
            if alert is not None:
                yield alert


def _alert(
    msg: StreamMessage, skipped: Callable[[MalformedMessageError], None]
) -> alert_pb2.Alert | None:
    """The alert `msg` holds; None (reported to `skipped`) when it holds none."""
    check = msg.check()
    if not check.ok:  # not signed by the node of its subject (signatures on)
        refused = f"{msg.subject}: {check.reason}"
        skipped(MalformedMessageError(refused, subject=msg.subject))
        return None
    try:
        alert = codec.decode_json(alert_pb2.Alert, msg.data, subject=msg.subject)
        if check.writer is not None and token(alert.node) != token(check.writer.node):
            raise MalformedMessageError(  # an alert's node is its signer's node
                f"{msg.subject}: an alert of node {alert.node[:64]!r} signed by "
                f"{check.writer.node[:64]!r}", subject=msg.subject,
            )  # fmt: skip
    except MalformedMessageError as exc:  # one bad message must not end the listing
        skipped(exc)
        return None
    return alert
