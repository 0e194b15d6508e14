"""Ops alerts: `drasuite.v1.Alert` as proto3 JSON on the node's subject of the alerts stream.

RAISED when a fault starts, RESOLVED when it ends. `id` is deterministic per (device, cause,
fault start, status) and doubles as the JetStream message ID, so a retried publish is
deduplicated. While NATS is down alerts wait in a bounded queue and go out in order later.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Callable

import structlog
from opentelemetry.context import Context

from services.health import instruments
from services.health.policy import DeviceState, Taint
from shared import telemetry
from shared.backoff import Backoff
from shared.bus import codec
from shared.bus.connection import Bus
from shared.cancellation import reraise_if_cancelling
from shared.errors import BusUnavailableError
from shared.pb.drasuite.v1 import alert_pb2

__all__ = ["SCHEMA_VERSION", "AlertPublisher", "alert_id", "raised", "resolved"]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)

SCHEMA_VERSION = 1
_STATUS_NAMES = {
    alert_pb2.ALERT_STATUS_RAISED: "raised",
    alert_pb2.ALERT_STATUS_RESOLVED: "resolved",
}


def alert_id(
    *,
    driver: str,
    node: str,
    device: str,
    cause: str,
    since_ms: int,
    status: alert_pb2.AlertStatus.ValueType,
) -> str:
    """Stable ID of one alert: the same fault start and status always give the same ID."""
    text = "\x00".join((driver, node, device, cause, str(since_ms), _STATUS_NAMES[status]))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _alert(
    state: DeviceState,
    *,
    status: alert_pb2.AlertStatus.ValueType,
    driver: str,
    node: str,
    pool: str,
    taint: Taint | None,
) -> alert_pb2.Alert:
    fault = state.fault
    cause = fault.cause if fault is not None else ""
    since_ms = int(state.fault_since * 1000)
    return alert_pb2.Alert(
        schema_version=SCHEMA_VERSION,
        id=alert_id(
            driver=driver,
            node=node,
            device=state.device,
            cause=cause,
            since_ms=since_ms,
            status=status,
        ),
        status=status,
        driver=driver,
        node=node,
        pool=pool,
        device=state.device,
        cause=cause,
        code=fault.code if fault is not None else "",
        message=fault.message if fault is not None else "",
        taint=str(taint) if taint is not None else "",
        raised_unix_ms=since_ms,
        trace_id=telemetry.current_trace_id(),
    )


def raised(
    state: DeviceState, *, driver: str, node: str, pool: str, taint: Taint | None
) -> alert_pb2.Alert:
    """The RAISED alert of the fault `state` holds; `taint` is the one applied (if any)."""
    return _alert(
        state,
        status=alert_pb2.ALERT_STATUS_RAISED,
        driver=driver,
        node=node,
        pool=pool,
        taint=taint,
    )


def resolved(
    state: DeviceState, *, driver: str, node: str, pool: str, taint: Taint | None, now: float
) -> alert_pb2.Alert:
    """The RESOLVED alert of the faulty `state` that ended at `now`."""
    alert = _alert(
        state,
        status=alert_pb2.ALERT_STATUS_RESOLVED,
        driver=driver,
        node=node,
        pool=pool,
        taint=taint,
    )
    alert.resolved_unix_ms = int(now * 1000)
    return alert


class AlertPublisher:
    def __init__(
        self,
        bus: Bus,
        *,
        driver: str,
        node: str,
        max_age_s: float,
        queue_size: int,
        duplicate_window_s: float = 120.0,
        notify: Callable[[alert_pb2.Alert], None] | None = None,
    ) -> None:
        """`notify` also gets every alert, at once (the optional webhook; must not block)."""
        self._bus = bus
        self._subject = bus.names.alerts(driver, node)
        self._node = node
        self._max_age_s = max_age_s
        self._duplicate_window_s = duplicate_window_s
        self._queue: deque[tuple[alert_pb2.Alert, Context | None]] = deque()
        self._queue_size = queue_size
        self._pending = asyncio.Event()
        self._stream_epoch = 0
        self.published = 0
        self._notify = notify

    def publish(self, alert: alert_pb2.Alert, *, context: Context | None = None) -> None:
        """Queue `alert`; when the queue is full the oldest alert is dropped (and logged)."""
        if len(self._queue) >= self._queue_size:
            dropped, _ = self._queue.popleft()
            log.error("alert_dropped", node=self._node, device=dropped.device, alert_id=dropped.id)
        self._queue.append((alert, context))
        self._pending.set()
        if self._notify is not None:
            self._notify(alert)

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def run(self) -> None:
        """Eternal: deliver queued alerts in order, waiting out NATS outages."""
        backoff = Backoff(initial_s=0.1, max_s=5.0)
        while True:
            await self._pending.wait()
            await self._bus.connected.wait()
            try:
                await self._drain()
            except BusUnavailableError as exc:
                delay = backoff.next_delay()
                log.warning(
                    "alerts_deferred", node=self._node, pending=len(self._queue), error=str(exc)
                )
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            reraise_if_cancelling()
            if not self._queue:
                self._pending.clear()

    async def _drain(self) -> None:
        if self._stream_epoch != self._bus.epoch:
            # Each (re)connect may face a new server: make sure the stream is there.
            epoch = self._bus.epoch
            await self._bus.ensure_stream(
                name=self._bus.names.alerts_stream,
                subjects=[self._bus.names.alerts_wildcard],
                max_age_s=self._max_age_s,
                duplicate_window_s=self._duplicate_window_s,
            )
            self._stream_epoch = epoch
        while self._queue:
            # Taken off first, so that an overflow while it is in flight cannot drop another.
            alert, context = self._queue.popleft()
            try:
                with tracer.start_as_current_span(
                    "health.publish_alert", context=context, attributes={"alert_id": alert.id}
                ):
                    headers = telemetry.inject({})
                    await self._bus.publish_js(
                        self._subject, codec.encode_json(alert), msg_id=alert.id, headers=headers
                    )
            except BusUnavailableError:
                self._queue.appendleft((alert, context))
                raise
            self.published += 1
            status = alert_pb2.AlertStatus.Name(alert.status).removeprefix("ALERT_STATUS_").lower()
            instruments.ALERTS_PUBLISHED.add(1, {"status": status})
            log.info("alert_published", node=self._node, device=alert.device, alert_id=alert.id)
