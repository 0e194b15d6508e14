"""A kubelet stand-in for the device-plugin side: its device manager, over real gRPC.

Like the kubelet (pkg/kubelet/cm/devicemanager): it serves `v1beta1.Registration` on
`<dir>/kubelet.sock`, checks a registration (API version `v1beta1`, a qualified extended
resource name, an endpoint socket in the directory), answers, and then dials the plugin:
GetDevicePluginOptions, and one ListAndWatch stream per resource whose latest list is the
node's capacity of that resource. A new registration of a resource replaces the old one.
Allocate and GetPreferredAllocation are made on request by tests and the devcluster, or as
the device manager admits a container (`admit`: free healthy devices, the plugin's preferred
choice among them, Allocate).

`refuse_registrations` makes the first registrations fail (the plugin must try again).
`restart()` does what a kubelet start does to the directory: every file in it is removed
(plugin sockets included) and kubelet.sock is created anew, which tells plugins to register
again. The allocations it made survive in `allocations` (the kubelet's checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from shared.pb.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
from shared.pb.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

__all__ = [
    "SUPPORTED_VERSIONS",
    "DevicePluginKubelet",
    "DeviceUpdate",
    "KubeletDeviceError",
    "PluginEndpoint",
]

SUPPORTED_VERSIONS = ("v1beta1",)
KUBELET_SOCKET = "kubelet.sock"
_CALL_TIMEOUT_S = 10.0
# pkg/apis/core/v1/helper IsExtendedResourceName: a qualified name outside kubernetes.io.
_QUALIFIED = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

Context = grpc.aio.ServicerContext[Any, Any]


class KubeletDeviceError(Exception):
    """What the kubelet would log: a refused registration or a failed device plugin call."""


@dataclass(frozen=True, slots=True)
class DeviceUpdate:
    """One ListAndWatch message as the kubelet received it."""

    received_s: float
    """`time.monotonic()` at receipt."""
    health: dict[str, str]
    numa: dict[str, tuple[int, ...]]


@dataclass(slots=True)
class PluginEndpoint:
    """A registered plugin: its resource, socket, options, and the device lists it sent."""

    resource: str
    socket: Path
    options: dp.DevicePluginOptions
    channel: grpc.aio.Channel
    updates: list[DeviceUpdate] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    stream: asyncio.Task[None] | None = None

    @property
    def devices(self) -> dict[str, str]:
        """Device ID -> health of the latest list (empty before the first)."""
        return self.updates[-1].health if self.updates else {}


class DevicePluginKubelet(dp_grpc.RegistrationServicer):
    """`await kubelet.start()`, then `wait_for_devices`/`allocate`/`preferred`, then `stop()`."""

    def __init__(self, plugin_dir: Path, *, refuse_registrations: int = 0) -> None:
        """`refuse_registrations`: that many valid registrations fail first, as when another
        plugin's registration of the resource is still in the kubelet's way."""
        self.plugin_dir = plugin_dir
        self.refuse_registrations = refuse_registrations
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.registrations: list[str] = []
        """Resource of every accepted registration, in order."""
        self.refused: list[str] = []
        self.allocations: dict[str, list[list[str]]] = {}
        """Resource -> device IDs of every container allocated (the kubelet's checkpoint)."""
        self._server: grpc.aio.Server | None = None

    @property
    def socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        for path in self.plugin_dir.iterdir():
            if not path.is_dir():
                path.unlink()  # the device manager's start: only its checkpoint would stay
        server = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        for endpoint in self.endpoints.values():
            await _close(endpoint)
        self.endpoints.clear()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def restart(self) -> None:
        """Stop, wipe the directory, serve a new kubelet.sock; allocations are kept."""
        await self.stop()
        await self.start()

    # --- Registration (called by plugins) --------------------------------------------------

    async def Register(self, request: dp.RegisterRequest, context: Context) -> dp.Empty:
        problem = self._problem(request)
        if problem is None and self.refuse_registrations > 0:
            self.refuse_registrations -= 1
            problem = f"resource {request.resource_name} is being registered by another plugin"
        if problem is not None:
            self.refused.append(problem)
            await context.abort(grpc.StatusCode.UNKNOWN, problem)
        old = self.endpoints.pop(request.resource_name, None)
        if old is not None:
            await _close(old)
            old.changed.set()  # waiters on the old endpoint look again
        endpoint = PluginEndpoint(
            resource=request.resource_name,
            socket=self.plugin_dir / request.endpoint,
            options=request.options,
            channel=grpc.aio.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}"),
        )
        self.endpoints[request.resource_name] = endpoint
        self.registrations.append(request.resource_name)
        # The kubelet answers first and dials the plugin afterwards (runEndpoint).
        endpoint.stream = asyncio.create_task(
            self._list_and_watch(endpoint), name=f"list-and-watch-{request.resource_name}"
        )
        return dp.Empty()

    def _problem(self, request: dp.RegisterRequest) -> str | None:
        if request.version not in SUPPORTED_VERSIONS:
            return f"invalid version {request.version!r}: not one of {SUPPORTED_VERSIONS}"
        name = request.resource_name
        if not _QUALIFIED.match(name) or name.split("/")[0].endswith("kubernetes.io"):
            return f"invalid resource name {name!r}: not an extended resource name"
        if "/" in request.endpoint or not (self.plugin_dir / request.endpoint).is_socket():
            return f"invalid endpoint {request.endpoint!r}: no socket in {self.plugin_dir}"
        return None

    async def _list_and_watch(self, endpoint: PluginEndpoint) -> None:
        stub = dp_grpc.DevicePluginStub(endpoint.channel)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.GetDevicePluginOptions(dp.Empty(), timeout=_CALL_TIMEOUT_S)
            async for response in stub.ListAndWatch(dp.Empty()):
                endpoint.updates.append(
                    DeviceUpdate(
                        received_s=time.monotonic(),
                        health={d.ID: d.health for d in response.devices},
                        numa={
                            d.ID: tuple(n.ID for n in d.topology.nodes) for d in response.devices
                        },
                    )
                )
                changed, endpoint.changed = endpoint.changed, asyncio.Event()
                changed.set()

    # --- the device manager's calls ---------------------------------------------------------

    def endpoint(self, resource: str) -> PluginEndpoint:
        try:
            return self.endpoints[resource]
        except KeyError:
            raise KubeletDeviceError(f"no device plugin registered for {resource}") from None

    async def wait_for_devices(
        self,
        resource: str,
        predicate: Callable[[dict[str, str]], bool] = bool,
        *,
        timeout_s: float = 10.0,
    ) -> dict[str, str]:
        """The first device list of `resource` (registered meanwhile) that satisfies `predicate`."""
        async with asyncio.timeout(timeout_s):
            while True:
                endpoint = self.endpoints.get(resource)
                if endpoint is not None:
                    changed = endpoint.changed
                    if predicate(endpoint.devices):
                        return endpoint.devices
                    await changed.wait()
                else:
                    await asyncio.sleep(0.02)

    async def preferred(
        self,
        resource: str,
        *,
        available: Iterable[str],
        must_include: Iterable[str] = (),
        size: int,
    ) -> list[str]:
        request = dp.PreferredAllocationRequest()
        request.container_requests.add(
            available_deviceIDs=list(available),
            must_include_deviceIDs=list(must_include),
            allocation_size=size,
        )
        response = await self._call(resource, "GetPreferredAllocation", request)
        (container,) = response.container_responses
        return list(container.deviceIDs)

    async def allocate(
        self, resource: str, containers: Sequence[Sequence[str]]
    ) -> dp.AllocateResponse:
        """Allocate as at container creation; the kubelet checks one answer per container."""
        request = dp.AllocateRequest()
        for ids in containers:
            request.container_requests.add(devices_ids=list(ids))
        response: dp.AllocateResponse = await self._call(resource, "Allocate", request)
        if len(response.container_responses) != len(containers):
            raise KubeletDeviceError(
                f"{resource}: {len(response.container_responses)} answers for "
                f"{len(containers)} containers"
            )
        self.allocations.setdefault(resource, []).extend(list(ids) for ids in containers)
        return response

    async def admit(self, resource: str, count: int) -> dp.ContainerAllocateResponse:
        """A container asking for `count` of `resource`, as the device manager handles it:
        the healthy devices no container holds, the plugin's preferred choice among them
        (when it offers one, else the first), then Allocate."""
        endpoint = self.endpoint(resource)
        held = {d for ids in self.allocations.get(resource, []) for d in ids}
        free = sorted(d for d, health in endpoint.devices.items() if health == "Healthy")
        free = [d for d in free if d not in held]
        if len(free) < count:
            raise KubeletDeviceError(f"{resource}: {count} wanted, {len(free)} allocatable")
        if endpoint.options.get_preferred_allocation_available:
            chosen = await self.preferred(resource, available=free, size=count)
        else:
            chosen = free[:count]
        response = await self.allocate(resource, [chosen])
        return response.container_responses[0]

    async def _call(self, resource: str, method: str, request: Any) -> Any:
        stub = dp_grpc.DevicePluginStub(self.endpoint(resource).channel)
        try:
            return await getattr(stub, method)(request, timeout=_CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise KubeletDeviceError(
                f"{resource} {method}: {exc.code().name}: {exc.details()}"
            ) from exc


async def _close(endpoint: PluginEndpoint) -> None:
    if endpoint.stream is not None:
        endpoint.stream.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await endpoint.stream
    await endpoint.channel.close()
