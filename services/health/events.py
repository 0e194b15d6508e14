"""Kubernetes Events on this Node for device health transitions (DeviceUnhealthy/Recovered).

`emit()` queues an Event without I/O; `run()` (the event-writer task) writes them in order.
Names are deterministic per (device, reason, time), so a repeated write is a no-op (409).
Failures are logged and the Event dropped: Events are informational, never fatal.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from opentelemetry.context import Context

from shared import telemetry
from shared.backoff import retry
from shared.errors import KubeAlreadyExistsError, KubeError, RecoverableError
from shared.kube.client import KubeClient
from shared.kube.resources import EVENTS, NODES

__all__ = [
    "COMPONENT",
    "RECOVERED",
    "UNHEALTHY",
    "DeviceEvent",
    "NodeEventWriter",
    "event_body",
    "event_name",
]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)

COMPONENT = "dra-suite-health"
UNHEALTHY = "DeviceUnhealthy"
RECOVERED = "DeviceRecovered"
_TYPES = {UNHEALTHY: "Warning", RECOVERED: "Normal"}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceEvent:
    reason: str
    """UNHEALTHY or RECOVERED."""
    device: str
    message: str
    at: float
    """When the transition happened, Unix seconds."""


def event_name(node: str, event: DeviceEvent) -> str:
    """`<node>.<hash of device, reason and time>`, at most 253 characters."""
    at_ms = str(int(event.at * 1000))
    digest = hashlib.sha256(f"{event.device}\x00{event.reason}\x00{at_ms}".encode()).hexdigest()
    return f"{node[: 253 - 17].rstrip('.-')}.{digest[:16]}"


def _timestamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(event: DeviceEvent, *, node: str, namespace: str, node_uid: str) -> dict[str, Any]:
    involved: dict[str, str] = {"apiVersion": "v1", "kind": "Node", "name": node}
    if node_uid:
        involved["uid"] = node_uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(node, event), "namespace": namespace},
        "involvedObject": involved,
        "reason": event.reason,
        "message": f"device {event.device}: {event.message}"[:1024],
        "type": _TYPES.get(event.reason, "Normal"),
        "source": {"component": COMPONENT, "host": node},
        "firstTimestamp": _timestamp(event.at),
        "lastTimestamp": _timestamp(event.at),
        "count": 1,
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
    }


class NodeEventWriter:
    def __init__(
        self, kube: KubeClient, *, node: str, namespace: str, queue_size: int = 256
    ) -> None:
        self._kube = kube
        self._node = node
        self._namespace = namespace
        self._queue: deque[tuple[DeviceEvent, Context | None]] = deque()
        self._queue_size = queue_size
        self._pending = asyncio.Event()
        self._node_uid = ""

    def emit(self, event: DeviceEvent, *, context: Context | None = None) -> None:
        """Queue `event`; when the queue is full the oldest one is dropped (and logged)."""
        if len(self._queue) >= self._queue_size:
            dropped, _ = self._queue.popleft()
            log.warning(
                "event_dropped", node=self._node, device=dropped.device, reason=dropped.reason
            )
        self._queue.append((event, context))
        self._pending.set()

    async def run(self) -> None:
        """Eternal: write queued Events in order."""
        while True:
            await self._pending.wait()
            while self._queue:
                event, context = self._queue.popleft()
                with tracer.start_as_current_span(
                    "health.write_event",
                    context=context,
                    attributes={"device": event.device, "reason": event.reason},
                ):
                    await self._write(event)
            self._pending.clear()

    async def _write(self, event: DeviceEvent) -> None:
        try:
            uid = await self._uid()
            body = event_body(event, node=self._node, namespace=self._namespace, node_uid=uid)
            await retry(
                lambda: self._kube.create(EVENTS, body, namespace=self._namespace),
                what="create node event",
                attempts=4,
            )
        except KubeAlreadyExistsError:
            return  # written before (a repeat after a restart): nothing to do
        except (KubeError, RecoverableError) as exc:
            log.warning("event_write_failed", node=self._node, device=event.device, error=str(exc))
            return
        log.info("event_written", node=self._node, device=event.device, reason=event.reason)

    async def _uid(self) -> str:
        """The Node's UID, looked up once it can be (Events are fine without it)."""
        if not self._node_uid:
            try:
                node = await self._kube.get(NODES, self._node)
            except (KubeError, RecoverableError) as exc:
                log.debug("node_uid_unknown", node=self._node, error=str(exc))
                return ""
            self._node_uid = str(node.get("metadata", {}).get("uid", ""))
        return self._node_uid
