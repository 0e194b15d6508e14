"""Kubernetes Events on this Node about its slices and its backend, best effort.

An Event that cannot be written is logged and dropped: it must never block publishing.
`warn_node` writes one Warning (a rejected slice, dropped fields). `NodeEvents` aggregates, as
the kubelet's event recorder does: a repeat of a reason within `window_s` of the last write
updates that Event (`count`, `lastTimestamp`, `message`) instead of creating another one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from services.discovery.slices import Owner
from shared.errors import KubeError, KubeNotFoundError, RecoverableError
from shared.kube.client import KubeClient
from shared.kube.resources import EVENTS, NODES

__all__ = ["COMPONENT", "NORMAL", "WARNING", "NodeEvents", "warn_node"]

log = structlog.get_logger(__name__)

COMPONENT = "dra-discovery"
NORMAL = "Normal"
WARNING = "Warning"
# Node events live in the default namespace, as the kubelet's do.
_NAMESPACE = "default"
_MAX_MESSAGE = 1024


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _body(
    node: str, uid: str, *, type_: str, reason: str, message: str, count: int
) -> dict[str, Any]:
    involved: dict[str, str] = {"apiVersion": "v1", "kind": "Node", "name": node}
    if uid:
        involved["uid"] = uid
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": _NAMESPACE},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:_MAX_MESSAGE],
        "type": type_,
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": count,
    }


async def warn_node(client: KubeClient, node: Owner, *, reason: str, message: str) -> None:
    """Record a Warning Event on the Node; failures are logged, never raised."""
    body = _body(node.name, node.uid, type_=WARNING, reason=reason, message=message, count=1)
    try:
        await client.create(EVENTS, body, namespace=_NAMESPACE)
    except (KubeError, RecoverableError) as exc:
        log.warning("event_not_recorded", node=node.name, reason=reason, error=str(exc))


@dataclass(slots=True)
class _Written:
    name: str
    count: int
    at: float


class NodeEvents:
    """Aggregated Events on one Node, one Event per reason and window."""

    def __init__(
        self,
        client: KubeClient,
        *,
        node: str,
        window_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.node = node
        self.window_s = window_s
        self._clock = clock
        self._uid = ""
        self._last: dict[str, _Written] = {}

    async def record(self, *, type_: str, reason: str, message: str, count: int = 1) -> bool:
        """Record `count` occurrences; True when written (failures are logged, not raised)."""
        written = self._last.get(reason)
        now = self._clock()
        try:
            if written is not None and now - written.at < self.window_s:
                try:
                    await self._add(written, message=message, count=count)
                except KubeNotFoundError:
                    pass  # expired or deleted meanwhile: a new one below
                else:
                    written.at = now
                    return True
            body = _body(
                self.node,
                await self._node_uid(),
                type_=type_,
                reason=reason,
                message=message,
                count=count,
            )
            created = await self.client.create(EVENTS, body, namespace=_NAMESPACE)
        except (KubeError, RecoverableError) as exc:
            log.warning("event_not_recorded", node=self.node, reason=reason, error=str(exc))
            return False
        self._last[reason] = _Written(str(created["metadata"]["name"]), count, now)
        return True

    async def _add(self, written: _Written, *, message: str, count: int) -> None:
        patch = {
            "count": written.count + count,
            "lastTimestamp": _now(),
            "message": message[:_MAX_MESSAGE],
        }
        await self.client.patch(EVENTS, written.name, patch, namespace=_NAMESPACE)
        written.count += count

    async def _node_uid(self) -> str:
        """The Node's UID, looked up once it can be (an Event is fine without it)."""
        if not self._uid:
            try:
                node = await self.client.get(NODES, self.node)
            except (KubeError, RecoverableError) as exc:
                log.debug("node_uid_unknown", node=self.node, error=str(exc))
                return ""
            self._uid = str(node.get("metadata", {}).get("uid", ""))
        return self._uid
