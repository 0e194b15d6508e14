"""The device-plugin front: one gRPC server and one kubelet registration per resource.

`run()` (an eternal task) keeps three things in step with the inventory and the kubelet:
a server on `<device plugin dir>/<driver>-<resource>.sock` for every resource the inventory
offers (started before registering: the kubelet dials at once), a registration of each with
the kubelet, and the static CDI spec the Allocate answers name. The kubelet removes every
plugin socket when it starts, then creates `kubelet.sock` anew: a new kubelet.sock (or our
socket gone) re-creates our server and registers again. Allocations live in the kubelet's own
checkpoint and in the static spec, which a re-registration leaves alone, so none is lost.
The spec stays when the agent stops: the kubelet may restart a container from its checkpoint
with the CDI names it got. A refused registration is retried with jittered exponential
backoff (at once for a new kubelet).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import grpc
import structlog

from services.allocation.deviceplugin import container_devices, instruments, registration
from services.allocation.deviceplugin.catalog import DeviceCatalog
from services.allocation.deviceplugin.service import OPTIONS, DevicePluginService
from services.allocation.kubelet import socket_server
from services.allocation.node_view.health_board import HealthBoard
from shared import atomicfile
from shared.backoff import Backoff
from shared.errors import ClaimError
from shared.pb.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

__all__ = ["DevicePluginFront", "socket_name"]

log = structlog.get_logger(__name__)

_STOP_GRACE_S = 1.0
_SPEC_MODE = 0o644  # container runtimes read specs; they hold no secrets


def socket_name(driver: str, resource: str) -> str:
    """`sim.dra-suite.io-sim.dra-suite.io_npu.sock`: the driver's prefix, the resource's name."""
    return f"{driver}-{resource.replace('/', '_')}.sock"


class DevicePluginFront:
    def __init__(
        self,
        *,
        catalog: DeviceCatalog,
        board: HealthBoard,
        plugin_dir: Path,
        cdi_root: Path,
        poll_s: float = 0.2,
    ) -> None:
        self.catalog = catalog
        self.board = board
        self.plugin_dir = plugin_dir
        self.cdi_root = cdi_root
        self.poll_s = poll_s
        self.services: dict[str, DevicePluginService] = {}
        self.registered: set[str] = set()
        """Resources the current kubelet accepted."""
        self.registrations = 0
        """Successful Register calls (re-registrations included)."""
        self._servers: dict[str, grpc.aio.Server] = {}
        self._retries: dict[str, tuple[Backoff, float]] = {}
        """Resource -> (its backoff, loop time of the next attempt) after a refusal."""
        self._kubelet: tuple[int, int] | None = None
        self._spec: dict[str, Any] | None = None
        self._spec_source: object = None
        """The resources the spec on disk was last computed from."""

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / "kubelet.sock"

    @property
    def spec_path(self) -> Path:
        return self.cdi_root / container_devices.spec_file_name(self.catalog.driver)

    def socket_path(self, resource: str) -> Path:
        return self.plugin_dir / socket_name(self.catalog.driver, resource)

    def socket_paths(self) -> list[Path]:
        """The sockets being served now."""
        return [self.socket_path(resource) for resource in sorted(self._servers)]

    async def run(self) -> None:
        """Eternal: follow the inventory and the kubelet."""
        while True:
            changed = self.board.changed()
            await self.sync()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await changed.wait()

    async def sync(self) -> None:
        """One round: spec, servers, registrations."""
        resources = self.catalog.resources()
        await self._write_spec()
        names = sorted(set(resources) | set(self._servers))
        kubelet, missing = await asyncio.to_thread(self._look, names)
        if kubelet != self._kubelet:
            # A kubelet (re)started or went away: whatever it knew of us is gone.
            log.info("kubelet_socket_changed", socket=str(self.kubelet_socket), up=bool(kubelet))
            self._kubelet = kubelet
            self.registered.clear()
            self._retries.clear()
        for resource in names:
            # Not ours yet (a socket file there is a crashed run's), or removed by the kubelet.
            if resource not in self._servers or resource in missing:
                await self._serve(resource)
                self.registered.discard(resource)
            if kubelet is not None and resource not in self.registered and self._due(resource):
                await self._register(resource)

    def _look(self, resources: list[str]) -> tuple[tuple[int, int] | None, set[str]]:
        """kubelet.sock's identity, and the resources whose socket is not there (blocking)."""
        kubelet = registration.kubelet_identity(self.kubelet_socket)
        return kubelet, {r for r in resources if not self.socket_path(r).is_socket()}

    async def _serve(self, resource: str) -> None:
        old = self._servers.pop(resource, None)
        path = self.socket_path(resource)
        if old is not None:
            await socket_server.stop(old, path, grace_s=_STOP_GRACE_S)
        service = self.services.setdefault(
            resource, DevicePluginService(resource=resource, catalog=self.catalog, board=self.board)
        )
        self._servers[resource] = await socket_server.start(
            path, lambda server: dp_grpc.add_DevicePluginServicer_to_server(service, server)
        )

    def _due(self, resource: str) -> bool:
        retry = self._retries.get(resource)
        return retry is None or asyncio.get_running_loop().time() >= retry[1]

    async def _register(self, resource: str) -> None:
        try:
            await registration.register(
                self.kubelet_socket,
                resource=resource,
                endpoint=self.socket_path(resource).name,
                options=OPTIONS,
            )
        except registration.RegistrationError as exc:
            backoff = self._retries.get(resource, (Backoff(initial_s=0.5, max_s=30.0), 0.0))[0]
            delay = backoff.next_delay()
            self._retries[resource] = (backoff, asyncio.get_running_loop().time() + delay)
            instruments.REGISTRATIONS.add(1, {"resource": resource, "outcome": "error"})
            log.warning(
                "device_plugin_registration_failed",
                resource=resource,
                error=str(exc),
                retry_in_s=round(delay, 3),
            )
            return
        self._retries.pop(resource, None)
        self.registered.add(resource)
        self.registrations += 1
        instruments.REGISTRATIONS.add(1, {"resource": resource, "outcome": "ok"})
        log.info("device_plugin_registered", resource=resource)

    async def _write_spec(self) -> None:
        """Write the static spec when the resources changed (never twice for one set)."""
        current = self.catalog.resources()
        if current is self._spec_source:
            return
        self._spec_source = current
        devices = [device for resource in current.values() for device in resource.devices]
        try:
            spec, refused = container_devices.static_spec(
                devices, backend=self.catalog.backend, driver=self.catalog.driver
            )
        except ClaimError as exc:
            log.error("device_plugin_spec_refused", error=str(exc), security=True)
            return
        if spec is None or spec == self._spec:
            return
        for device, error in refused.items():
            log.error("device_edits_refused", device=device[:64], error=error, security=True)
        data = json.dumps(spec, indent=2, sort_keys=True).encode()
        await asyncio.to_thread(atomicfile.make_dirs, self.cdi_root, mode=0o755)
        await asyncio.to_thread(atomicfile.write_atomic, self.spec_path, data, mode=_SPEC_MODE)
        self._spec = spec
        log.info(
            "device_plugin_spec_written", path=str(self.spec_path), devices=len(spec["devices"])
        )

    def device_counts(self) -> dict[tuple[str, str], int]:
        """(resource, health) -> devices, as the ListAndWatch streams would send them now."""
        counts: dict[tuple[str, str], int] = {}
        for resource, service in sorted(self.services.items()):
            for device in service.device_list().devices:
                counts[(resource, device.health)] = counts.get((resource, device.health), 0) + 1
        return counts

    def stream_counts(self) -> dict[str, int]:
        return {resource: service.streams for resource, service in sorted(self.services.items())}

    async def close(self) -> None:
        """Stop every server; its socket goes, which the kubelet takes as the plugin leaving."""
        for resource, server in sorted(self._servers.items()):
            await socket_server.stop(server, self.socket_path(resource), grace_s=_STOP_GRACE_S)
        self._servers.clear()
        self.registered.clear()
