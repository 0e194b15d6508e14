"""The kubelet device plugin API v1beta1 `DevicePlugin` servicer, one per extended resource.

Delegates: devices come from `DeviceCatalog` (the inventory, grouped by `resources`),
health from the `HealthBoard` (the health KV as it changes), the choice from `preference`, the
container edits from `container_devices` (the DRA prepare's allowlisted edits). A device the
health agent has no record of is `Healthy`: the device plugin API has no Unknown, and the
vendors' plugins start healthy too. Bad requests abort with INVALID_ARGUMENT, refused edits
with PERMISSION_DENIED; the kubelet then fails that pod's admission.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
import structlog
from opentelemetry import context as otel_context

from services.allocation import instruments as allocation_instruments
from services.allocation.cdi.allowlist import ForbiddenEditError
from services.allocation.deviceplugin import container_devices, instruments, preference
from services.allocation.deviceplugin.catalog import DeviceCatalog
from services.allocation.deviceplugin.resources import Resource
from services.allocation.node_view.board_trace import traced_send
from services.allocation.node_view.health_board import Health, HealthBoard
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.pb.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
from shared.pb.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

__all__ = ["HEALTHY", "OPTIONS", "UNHEALTHY", "DevicePluginService"]

log = structlog.get_logger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
OPTIONS = dp.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
"""What this plugin offers the kubelet's device manager."""

Context = grpc.aio.ServicerContext[Any, Any]


class DevicePluginService(dp_grpc.DevicePluginServicer):
    def __init__(self, *, resource: str, catalog: DeviceCatalog, board: HealthBoard) -> None:
        self.resource = resource
        self.catalog = catalog
        self.board = board
        self.streams = 0
        """Open ListAndWatch streams (the kubelet keeps one)."""

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: Context
    ) -> dp.DevicePluginOptions:
        return OPTIONS

    async def ListAndWatch(
        self, request: dp.Empty, context: Context
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        """The whole list at once, then again on every change of it, until we stop."""
        last: dp.ListAndWatchResponse | None = None
        sent: otel_context.Context | None = None
        self.streams += 1
        try:
            while not self.board.closed:
                # Both taken before reading: no change is missed.
                changes = (self.board.changed(), self.catalog.changed())
                current = self.device_list()
                if current != last:
                    sent = traced_send(self.board, "allocation.list_and_watch_update", after=sent)
                    yield current
                    last = current
                await _first(*changes)
        finally:
            self.streams -= 1

    def device_list(self) -> dp.ListAndWatchResponse:
        health = {view.device: view.health for view in self.board.snapshot()}
        response = dp.ListAndWatchResponse()
        for device in self.catalog.resource(self.resource).devices:
            unhealthy = health.get(device.name) == Health.UNHEALTHY
            entry = response.devices.add(ID=device.name, health=UNHEALTHY if unhealthy else HEALTHY)
            if "numaNode" in device.attributes:
                entry.topology.nodes.add(ID=device.attributes["numaNode"].int)
        return response

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: Context
    ) -> dp.PreferredAllocationResponse:
        resource = self.catalog.resource(self.resource)
        placements = [preference.placement_of(device) for device in resource.devices]
        response = dp.PreferredAllocationResponse()
        for container in request.container_requests:
            try:
                chosen = preference.preferred(
                    placements,
                    available=container.available_deviceIDs,
                    must_include=container.must_include_deviceIDs,
                    size=container.allocation_size,
                )
            except preference.PreferenceError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.resource}: {exc}")
            response.container_responses.add(deviceIDs=chosen)
        return response

    async def Allocate(self, request: dp.AllocateRequest, context: Context) -> dp.AllocateResponse:
        start = time.perf_counter()
        outcome = "error"
        try:
            response = self._allocate(request)
            outcome = "ok"
            return response
        except _AllocateError as exc:
            outcome = exc.outcome
            await context.abort(exc.code, exc.message)
        finally:
            instruments.ALLOCATE_SECONDS.record(
                time.perf_counter() - start, {"resource": self.resource, "outcome": outcome}
            )

    def _allocate(self, request: dp.AllocateRequest) -> dp.AllocateResponse:
        resource = self.catalog.resource(self.resource)
        response = dp.AllocateResponse()
        for container in request.container_requests:
            devices = self._devices(resource, container.devices_ids)
            allocation = self._allocation(devices)
            response.container_responses.append(_container_response(allocation))
        log.info(
            "devices_allocated",
            resource=self.resource,
            devices=[list(c.devices_ids) for c in request.container_requests],
        )
        return response

    def _allocation(
        self, devices: list[inventory_pb2.Device]
    ) -> container_devices.ContainerAllocation:
        try:
            return container_devices.container_allocation(
                devices,
                backend=self.catalog.backend,
                driver=self.catalog.driver,
                resource=self.resource,
            )
        except ForbiddenEditError as exc:
            for rejected in exc.rejected:
                allocation_instruments.REJECTED_EDITS.add(
                    1, {"backend": self.catalog.backend, "kind": rejected.kind}
                )
            log.error("allocate_refused", resource=self.resource, error=str(exc), security=True)
            raise _AllocateError("refused", grpc.StatusCode.PERMISSION_DENIED, str(exc)) from exc
        except ClaimError as exc:
            raise _AllocateError("error", grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc

    def _devices(self, resource: Resource, ids: Iterable[str]) -> list[inventory_pb2.Device]:
        """The inventory devices of `ids`; INVALID_ARGUMENT for none or an unknown one."""
        names = list(dict.fromkeys(ids))
        found = [(name, resource.device(name)) for name in names]
        devices = [device for _, device in found if device is not None]
        missing = [name[:63] for name, device in found if device is None]
        if not names or missing:
            raise _AllocateError(
                "invalid",
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{self.resource}: unknown devices {missing[:8]}" if missing else "no devices",
            )
        return devices

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: Context
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()  # never asked for (OPTIONS.pre_start_required)


class _AllocateError(Exception):
    """Why an Allocate fails: its metric outcome and the gRPC status to abort with."""

    def __init__(self, outcome: str, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.outcome, self.code, self.message = outcome, code, message


async def _first(*events: asyncio.Event) -> None:
    """Until any of `events` is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _container_response(
    allocation: container_devices.ContainerAllocation,
) -> dp.ContainerAllocateResponse:
    return dp.ContainerAllocateResponse(
        envs=allocation.envs,
        devices=[
            dp.DeviceSpec(container_path=path, host_path=host, permissions=allocation.permissions)
            for path, host in allocation.device_nodes
        ],
        cdi_devices=[dp.CDIDevice(name=name) for name in allocation.cdi_devices],
    )
