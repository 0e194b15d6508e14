"""Warning Events on the pods whose claims use a device that turned unhealthy (best effort).

`emit()` queues a DeviceUnhealthy event without I/O; `run()` (the pod-event-writer task)
takes everything queued, finds the pods of the claims prepared on this node with this device
(the allocation agent's prepared claims, `prepared_claims.PreparedClaims`: no ResourceClaim
is read from the API server) and writes one Event per pod in its namespace. Names are
deterministic, so a repeat is a no-op (409); any failure is logged and the event dropped: pod
Events are informational, never fatal.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from opentelemetry.context import Context

from services.health import events
from services.health.events import DeviceEvent
from services.health.prepared_claims import PreparedClaims
from shared import telemetry
from shared.errors import KubeAlreadyExistsError, KubeError, RecoverableError
from shared.kube.client import KubeClient
from shared.kube.resources import EVENTS
from shared.pb.drasuite.v1 import claim_pb2

__all__ = ["PodEventWriter", "PodRef", "pod_event_body", "pods_using"]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRef:
    """A pod that reserves a claim using the device, and that claim's name."""

    namespace: str
    name: str
    uid: str
    claim: str


def pods_using(
    claims: Iterable[claim_pb2.PreparedClaim], *, pool: str, device: str
) -> list[PodRef]:
    """The pods of the prepared claims with `pool`/`device`, once each (pure). A pod is in its
    claim's namespace; an entry naming another namespace is not believed."""
    found: dict[tuple[str, str], PodRef] = {}
    for claim in claims:
        if not any((d.pool, d.device) == (pool, device) for d in claim.devices):
            continue
        for pod in claim.pods:
            if pod.namespace != claim.namespace or not pod.name:
                continue
            ref = PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid, claim=claim.name)
            found.setdefault((pod.namespace, pod.name), ref)
    return list(found.values())


def _name(pod: PodRef, event: DeviceEvent) -> str:
    at_ms = str(int(event.at * 1000))
    key = f"{pod.uid}\x00{event.device}\x00{event.reason}\x00{at_ms}"
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{pod.name[: 253 - 17].rstrip('.-')}.{digest[:16]}"


def pod_event_body(event: DeviceEvent, pod: PodRef, *, node: str) -> dict[str, Any]:
    at = datetime.fromtimestamp(event.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": pod.namespace}
    if pod.uid:
        involved["uid"] = pod.uid
    message = f"device {event.device} of claim {pod.claim} on node {node}: {event.message}"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": _name(pod, event), "namespace": pod.namespace},
        "involvedObject": involved,
        "reason": event.reason,
        "message": message[:1024],
        "type": "Warning",
        "source": {"component": events.COMPONENT, "host": node},
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
        "reportingComponent": events.COMPONENT,
        "reportingInstance": node,
    }


class PodEventWriter:
    def __init__(
        self,
        kube: KubeClient,
        *,
        claims: PreparedClaims,
        driver: str,
        node: str,
        queue_size: int = 256,
    ) -> None:
        self._kube = kube
        self._claims = claims
        self._driver = driver
        self._node = node
        self._queue: deque[tuple[DeviceEvent, str, Context | None]] = deque(maxlen=queue_size)
        self._pending = asyncio.Event()
        self.written = 0

    def emit(self, event: DeviceEvent, *, pool: str, context: Context | None = None) -> None:
        """Queue `event` for the pods using its device in `pool` (the oldest drops when full)."""
        self._queue.append((event, pool, context))
        self._pending.set()

    async def run(self) -> None:
        """Eternal: one Event per pod of each queued event."""
        while True:
            await self._pending.wait()
            self._pending.clear()
            batch = list(self._queue)
            self._queue.clear()
            claims = self._claims.claims()
            for event, pool, context in batch:
                with tracer.start_as_current_span(
                    "health.write_pod_events", context=context, attributes={"device": event.device}
                ):
                    pods = pods_using(claims, pool=pool, device=event.device)
                    for pod in pods:
                        await self._write(event, pod)

    async def _write(self, event: DeviceEvent, pod: PodRef) -> None:
        body = pod_event_body(event, pod, node=self._node)
        try:
            await self._kube.create(EVENTS, body, namespace=pod.namespace)
        except KubeAlreadyExistsError:
            return
        except (KubeError, RecoverableError) as exc:
            log.warning(
                "pod_event_write_failed",
                node=self._node,
                device=event.device,
                namespace=pod.namespace,
                pod=pod.name,
                error=str(exc),
            )
            return
        self.written += 1
        log.info(
            "pod_event_written",
            node=self._node,
            device=event.device,
            namespace=pod.namespace,
            pod=pod.name,
        )
