"""The health of this node's devices as the kubelet should see it, and a change signal.

Fed by the inventory watcher (which devices exist) and the health watcher (records of the
health agent); read by every NodeWatchResources stream. A device without a record is Unknown.
No I/O here: the watchers and the gRPC streams live elsewhere.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.context import Context

from shared.pb.drasuite.v1 import health_pb2

__all__ = ["MESSAGE_MAX_LENGTH", "DeviceHealthView", "Health", "HealthBoard", "truncate_message"]

# core/v1 ResourceHealthMessageMaxLength.
MESSAGE_MAX_LENGTH = 1024


class Health(enum.StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


_FROM_STATE = {
    health_pb2.HEALTH_STATE_HEALTHY: Health.HEALTHY,
    health_pb2.HEALTH_STATE_UNHEALTHY: Health.UNHEALTHY,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceHealthView:
    pool: str
    device: str
    health: Health
    updated_s: int
    """Unix seconds of the health agent's record; now for a device without a record."""
    message: str


def truncate_message(message: str) -> str:
    """At most 1024 characters: longer messages keep 1021 and end with `...` (as the kubelet)."""
    if len(message) <= MESSAGE_MAX_LENGTH:
        return message
    return message[: MESSAGE_MAX_LENGTH - 3] + "..."


class HealthBoard:
    """Latest device list and health records; `changed()` is set on the next change."""

    def __init__(self, *, pool: str, clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self._clock = clock
        self._devices: tuple[str, ...] = ()
        self._records: dict[str, health_pb2.DeviceHealth] = {}
        self._changed = asyncio.Event()
        self.closed = False
        self.trace: Context | None = None
        """The trace of the latest change (a health record's write), which the streams that
        send it continue; None when that change carried none."""

    def close(self) -> None:
        """End every stream (the agent is stopping); the kubelet then marks devices Unknown."""
        self.closed = True
        self._notify()

    def changed(self) -> asyncio.Event:
        """The event of the *next* change; take it before reading `snapshot()` to miss none."""
        return self._changed

    def _notify(self, trace: Context | None = None) -> None:
        self.trace = trace
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def set_devices(self, names: Iterable[str]) -> None:
        devices = tuple(names)
        if devices != self._devices:
            self._devices = devices
            self._notify()

    def put(
        self, device: str, record: health_pb2.DeviceHealth, *, trace: Context | None = None
    ) -> None:
        if self._records.get(device) != record:
            self._records[device] = record
            self._notify(trace)

    def remove(self, device: str, *, trace: Context | None = None) -> None:
        if self._records.pop(device, None) is not None:
            self._notify(trace)

    def retain(self, devices: Iterable[str]) -> None:
        """Drop records of devices not in `devices` (keys deleted while we were not watching)."""
        keep = set(devices)
        stale = [device for device in self._records if device not in keep]
        for device in stale:
            del self._records[device]
        if stale:
            self._notify()

    def snapshot(self) -> list[DeviceHealthView]:
        """Every inventory device of the node, in inventory order."""
        now = int(self._clock())
        return [self._view(device, now) for device in self._devices]

    def _view(self, device: str, now: int) -> DeviceHealthView:
        record = self._records.get(device)
        if record is None:
            return DeviceHealthView(
                pool=self.pool, device=device, health=Health.UNKNOWN, updated_s=now, message=""
            )
        return DeviceHealthView(
            pool=self.pool,
            device=device,
            health=_FROM_STATE.get(record.state, Health.UNKNOWN),
            updated_s=record.updated_unix_ms // 1000 if record.updated_unix_ms else now,
            message=truncate_message(record.message),
        )
