"""Optional Alertmanager-compatible webhook: ops alerts POSTed as API v2 `postableAlerts`.

`WebhookNotifier.notify` never blocks: it turns a `drasuite.v1.Alert` into one postable alert
and queues it (bounded; the oldest is dropped with a warning). The `alert-webhook` task POSTs
the queue as a JSON list to the configured URL (which includes `/api/v2/alerts`), with a
timeout per POST and a bounded number of jittered retries on connection errors, timeouts,
408, 429 and 5xx; other 4xx answers are final. Alertmanager resolves an alert without
`endsAt` after its `resolve_timeout`, so the alerts still raised are re-sent every
`resend_s` while nothing else is queued, as Prometheus does. Independent of NATS.
"""

from __future__ import annotations

import asyncio
import datetime
from collections import deque
from typing import Any

import aiohttp
import structlog

from shared.backoff import Backoff
from shared.pb.drasuite.v1 import alert_pb2

__all__ = ["ALERTNAME", "WebhookNotifier", "postable_alert"]

log = structlog.get_logger(__name__)

ALERTNAME = "DRADeviceUnhealthy"
_MAX_BATCH = 64
_RETRIED_4XX = frozenset({408, 429})
PostableAlert = dict[str, Any]


def _rfc3339(unix_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(unix_ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _severity(taint: str) -> str:
    """`critical` for a NoSchedule/NoExecute taint, `warning` for an informational or none."""
    return "critical" if taint and not taint.endswith(":None") else "warning"


def postable_alert(alert: alert_pb2.Alert) -> PostableAlert:
    """The Alertmanager API v2 `postableAlert` of `alert` (labels with empty values left out)."""
    labels = {
        "alertname": ALERTNAME,
        "driver": alert.driver,
        "node": alert.node,
        "pool": alert.pool,
        "device": alert.device,
        "cause": alert.cause,
        "code": alert.code,
        "severity": _severity(alert.taint),
    }
    what = f"{alert.cause} {alert.code}".strip() or "fault"
    body: PostableAlert = {
        "labels": {name: value for name, value in labels.items() if value},
        "annotations": {
            "summary": f"Device {alert.device} on node {alert.node}: {what}",
            "description": alert.message or what,
            "taint": alert.taint,
        },
        "startsAt": _rfc3339(alert.raised_unix_ms),
        "generatorURL": "",
    }
    if alert.status == alert_pb2.ALERT_STATUS_RESOLVED:
        body["endsAt"] = _rfc3339(alert.resolved_unix_ms)
    return body


class WebhookNotifier:
    """Delivers alerts to an Alertmanager-compatible receiver; `run` is the eternal task."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        attempts: int = 5,
        queue_size: int = 1000,
        resend_s: float = 60.0,
        backoff: Backoff | None = None,
    ) -> None:
        self.url = url
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._queue: deque[PostableAlert] = deque()
        self._queue_size = queue_size
        self._resend_s = resend_s
        self._backoff = backoff or Backoff(initial_s=0.5, max_s=10.0)
        self._active: dict[tuple[str, str], PostableAlert] = {}
        self._pending = asyncio.Event()
        self.delivered = 0
        """Alerts the receiver accepted (re-sends count again)."""
        self.dropped = 0
        """Alerts lost: queue overflow, retries exhausted or rejected by the receiver."""

    def notify(self, alert: alert_pb2.Alert) -> None:
        """Queue `alert` for the receiver; never blocks, never raises on a full queue."""
        body = postable_alert(alert)
        key = (alert.device, alert.cause)
        if alert.status == alert_pb2.ALERT_STATUS_RESOLVED:
            self._active.pop(key, None)
        else:
            self._active[key] = body
        self._enqueue(body)

    @property
    def pending(self) -> int:
        return len(self._queue)

    def _enqueue(self, body: PostableAlert) -> None:
        if len(self._queue) >= self._queue_size:
            dropped = self._queue.popleft()
            self.dropped += 1
            log.warning("alert_webhook_dropped", reason="queue full", labels=dropped["labels"])
        self._queue.append(body)
        self._pending.set()

    async def run(self) -> None:
        """Eternal: POST queued alerts in order; re-send the raised ones when idle."""
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self._wait_for_work()
                batch = [self._queue.popleft() for _ in range(min(_MAX_BATCH, len(self._queue)))]
                if not self._queue:
                    self._pending.clear()
                await self._deliver(session, batch)

    async def _wait_for_work(self) -> None:
        while not self._queue:
            try:
                await asyncio.wait_for(self._pending.wait(), timeout=self._resend_s)
            except TimeoutError:
                for body in self._active.values():
                    self._enqueue(body)
            if not self._queue:
                self._pending.clear()

    async def _deliver(self, session: aiohttp.ClientSession, batch: list[PostableAlert]) -> None:
        self._backoff.reset()
        error = ""
        for attempt in range(1, self._attempts + 1):
            try:
                async with session.post(self.url, json=batch) as response:
                    status = response.status
                    text = (await response.text())[:200] if status >= 300 else ""
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                error = str(exc) or type(exc).__name__
            else:
                if status < 300:
                    self.delivered += len(batch)
                    log.info("alert_webhook_delivered", alerts=len(batch), attempt=attempt)
                    return
                error = f"HTTP {status}: {text}"
                if 400 <= status < 500 and status not in _RETRIED_4XX:
                    self._give_up(batch, reason="rejected", error=error)
                    return
            if attempt < self._attempts:
                delay = self._backoff.next_delay()
                log.warning(
                    "alert_webhook_retrying", attempt=attempt, delay_s=round(delay, 3), error=error
                )
                await asyncio.sleep(delay)
        self._give_up(batch, reason="retries exhausted", error=error)

    def _give_up(self, batch: list[PostableAlert], *, reason: str, error: str) -> None:
        self.dropped += len(batch)
        log.error("alert_webhook_failed", alerts=len(batch), reason=reason, error=error)
