"""Manual drain: `dractl drain|undrain` requests on the node's drain-control subject.

A request is JSON `{"device": "...", "drain": true|false, "reason": "..."}`; the reply is
`{"ok": true, "device": ..., "drained": ...}` or `{"ok": false, "error": "..."}`. A drain
gives the device the `<driver>/drain` taint (NoSchedule) through the taint writer, beside
any fault taint; the rule itself (with the reason in an annotation) is what persists it, or,
with `--taint-target slice`, the device's health record (`changed` wakes its writer).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection
from typing import Any, Protocol

import structlog
from opentelemetry import context as otel_context

from services.health.taints import TaintWriter
from shared import telemetry
from shared.backoff import Backoff
from shared.bus.connection import Bus
from shared.errors import BusUnavailableError

__all__ = ["DrainControl", "Request"]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)
_REASON_MAX = 1024


class Request(Protocol):
    """The part of a NATS request message the handler uses."""

    @property
    def data(self) -> bytes: ...

    @property
    def headers(self) -> dict[str, str] | None: ...

    async def respond(self, data: bytes) -> None: ...


class DrainControl:
    def __init__(
        self,
        bus: Bus,
        *,
        driver: str,
        node: str,
        taints: TaintWriter,
        devices: Callable[[], Collection[str]],
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        """`changed` is called after every drain or undrain (the records carry drains)."""
        self._bus = bus
        self._changed = changed
        self._subject = bus.names.drain_control(driver, node)
        self._node = node
        self._taints = taints
        self._devices = devices

    async def run(self) -> None:
        """Eternal: subscribe once (nats-py keeps it across reconnects), then serve."""
        backoff = Backoff(initial_s=0.1, max_s=5.0)
        while True:
            await self._bus.connected.wait()
            try:
                await self._bus.serve(self._subject, self.handle)
                break
            except BusUnavailableError as exc:
                log.warning("drain_control_subscribe_failed", subject=self._subject, error=str(exc))
                await backoff.sleep()
        log.info("drain_control_subscribed", subject=self._subject)
        await asyncio.Event().wait()

    async def handle(self, msg: Request) -> None:
        """Serve one request in a span of the sender's trace (`dractl drain`), which the
        DeviceTaintRule write continues."""
        parent = telemetry.extract(telemetry.carried(msg.headers))
        with tracer.start_as_current_span(
            "health.drain_request", context=parent, attributes={"node": self._node}
        ):
            answer = self.command(msg.data)
        await msg.respond(json.dumps(answer).encode())

    def command(self, data: bytes) -> dict[str, Any]:
        """Apply one drain request; the reply as a dict."""
        try:
            request = json.loads(data)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            return {"ok": False, "error": f"malformed drain request: {exc}"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "malformed drain request: expected an object"}
        device, drain = request.get("device"), request.get("drain", True)
        reason = str(request.get("reason") or "manual drain")[:_REASON_MAX]
        if not isinstance(device, str) or not device or not isinstance(drain, bool):
            return {"ok": False, "error": "drain request: device (string) and drain (bool)"}
        if drain and device not in self._devices():
            return {"ok": False, "error": f"device {device}: unknown device on node {self._node}"}
        if drain:
            self._taints.drain(device, reason=reason, context=otel_context.get_current())
            self._changed()
            log.warning("device_drained", node=self._node, device=device, reason=reason)
            return {"ok": True, "device": device, "drained": True}
        found = self._taints.undrain(device, context=otel_context.get_current())
        self._changed()
        log.info("device_undrained", node=self._node, device=device, was_drained=found)
        return {"ok": True, "device": device, "drained": False, "was_drained": found}
