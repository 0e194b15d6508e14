"""The sim monitor: devices from the node's inventory in the KV, faults injected on command.

Faults come from the sim profile (present from the start) and from `FaultCommand` requests on
the node's fault-control subject; every change is reported at once. A command for an unknown
device or a malformed one gets an error reply and never stops the monitor. The view is also
re-reported every `refresh_s`, so the watchdog can tell a quiet node from a hung monitor.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Protocol

import structlog

from shared import telemetry
from shared.backoff import Backoff
from shared.bus import codec, kv
from shared.bus.connection import Bus
from shared.errors import BusUnavailableError, MalformedMessageError
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2
from shared.sim.profile import SimFault
from shared.vendors.parts.health import ObservationSink
from shared.vendors.parts.observation import Fault, Observation, Observations

__all__ = ["SimMonitor"]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)


class Request(Protocol):
    """The part of a NATS request message the control handler uses."""

    @property
    def data(self) -> bytes: ...

    @property
    def headers(self) -> dict[str, str] | None: ...

    async def respond(self, data: bytes) -> None: ...


class SimMonitor:
    """`DeviceMonitor` over the inventory KV and the fault-control subject."""

    def __init__(
        self,
        bus: Bus,
        *,
        driver: str,
        node: str,
        faults: Iterable[SimFault],
        refresh_s: float = 10.0,
    ) -> None:
        self._bus = bus
        self._refresh_s = refresh_s
        self._driver = driver
        self._node = node
        self._faults = {
            f.device: Fault(cause=f.cause, code=f.code, message=f.message) for f in faults
        }
        # The trace of the last command about each device: its observation carries it on.
        self._origins: dict[str, telemetry.Carrier] = {}
        self._pool = node
        self._devices: tuple[str, ...] | None = None  # None until the inventory is known
        self._sink: ObservationSink | None = None

    async def run(self, sink: ObservationSink) -> None:
        self._sink = sink
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch_inventory(), name="sim-inventory-watcher")
            tg.create_task(self._serve_control(), name="sim-fault-control")
            tg.create_task(self._refresh(), name="sim-refresher")

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            self._report()

    def view(self) -> Observations | None:
        """The current view; None while the device list is unknown."""
        if self._devices is None:
            return None
        devices = tuple(
            Observation(device=d, fault=self._faults.get(d), origin=self._origins.get(d, ()))
            for d in self._devices
        )
        return Observations(pool=self._pool, devices=devices)

    def _report(self) -> None:
        view = self.view()
        if view is not None and self._sink is not None:
            self._sink(view)

    async def _watch_inventory(self) -> None:
        names = self._bus.names
        key = names.inventory_key(self._driver, self._node)
        async for change in kv.watch(self._bus, bucket=names.inventory_bucket, keys=key):
            if change.synced or change.key != key:
                continue
            if change.value is None:
                self._apply_inventory(None)
                continue
            try:
                inventory = codec.decode(inventory_pb2.Inventory, change.value, subject=key)
            except MalformedMessageError as exc:
                log.warning("inventory_malformed", node=self._node, error=str(exc))
                continue
            if (inventory.driver, inventory.node) != (self._driver, self._node):
                owner = f"{inventory.driver[:64]!r}/{inventory.node[:64]!r}"
                log.warning("inventory_malformed", node=self._node, error=f"inventory of {owner}")
                continue
            self._apply_inventory(inventory)

    def _apply_inventory(self, inventory: inventory_pb2.Inventory | None) -> None:
        devices = tuple(d.name for d in inventory.devices) if inventory is not None else ()
        pool = (inventory.pool if inventory is not None else "") or self._node
        if (devices, pool) == (self._devices, self._pool):
            return
        self._devices, self._pool = devices, pool
        log.info("inventory_seen", node=self._node, pool=pool, devices=len(devices))
        self._report()

    async def _serve_control(self) -> None:
        subject = self._bus.names.fault_control(self._driver, self._node)
        backoff = Backoff(initial_s=0.1, max_s=5.0)
        while True:
            await self._bus.connected.wait()
            try:
                # nats-py keeps the subscription across reconnects; it only has to be made once.
                await self._bus.serve(subject, self.handle_command)
                break
            except BusUnavailableError as exc:
                log.warning("fault_control_subscribe_failed", subject=subject, error=str(exc))
                await backoff.sleep()
        log.info("fault_control_subscribed", subject=subject)
        await asyncio.Event().wait()

    async def handle_command(self, msg: Request) -> None:
        """Apply one FaultCommand and reply `{"ok": true}` or `{"ok": false, "error": ...}`
        (with `"retry": true` while the node's inventory is not known yet).

        The observation is a span of the sender's trace (`dractl fault`); the evaluation that
        follows, in another task, continues this span through the fault's `origin`."""
        parent = telemetry.extract(telemetry.carried(msg.headers))
        attributes = {"node": self._node}
        with tracer.start_as_current_span(
            "health.monitor_observation", context=parent, attributes=attributes
        ) as span:
            error = self._command(msg.data, origin=telemetry.carried(telemetry.inject({})))
            if error is not None:
                span.set_attribute("error", error)
        reply: dict[str, object] = {"ok": True} if error is None else {"ok": False, "error": error}
        if error is not None and self._devices is None:
            reply["retry"] = True  # the agent is starting: the same command may succeed later
        await msg.respond(json.dumps(reply).encode())

    def _command(self, data: bytes, *, origin: tuple[tuple[str, str], ...] = ()) -> str | None:
        subject = self._bus.names.fault_control(self._driver, self._node)
        try:
            command = codec.decode(health_pb2.FaultCommand, data, subject=subject)
        except MalformedMessageError as exc:
            log.warning("fault_command_malformed", node=self._node, error=str(exc))
            return f"malformed fault command: {exc}"
        if not command.device:
            return "fault command: device is required"
        if self._devices is None:
            return f"device {command.device}: the node's inventory is not known yet"
        if command.device not in self._devices:
            log.warning("fault_command_rejected", node=self._node, device=command.device)
            return f"device {command.device}: unknown device on node {self._node}"
        self._set_fault(command, origin=origin)
        self._report()
        return None

    def _set_fault(
        self, command: health_pb2.FaultCommand, *, origin: tuple[tuple[str, str], ...]
    ) -> None:
        self._origins[command.device] = origin
        if command.clear:
            self._faults.pop(command.device, None)
            log.info("fault_cleared", node=self._node, device=command.device)
            return
        fault = Fault(
            cause=command.cause or "injected",
            code=command.code,
            message=command.message,
            origin=origin,
        )
        self._faults[command.device] = fault
        log.info("fault_injected", node=self._node, device=command.device, cause=fault.cause)
