"""Device-plugin front figures: fault to ListAndWatch, and Allocate against its floor.

The local stack runs as processes (LocalStack: nats-server, the API emulator, the discovery,
health and DRA allocation agents on the sim profile `ascend-310p-duo`); the allocation agent
of the device-plugin front (`--kubelet-api device-plugin`) runs in this process under
`run_agent` for the same node, registered with the device-plugin kubelet emulator over real
gRPC on unix sockets. (A real node runs one front; here the DRA front's sockets are in
directories of their own, which the device-plugin front does not look at.)

`fault_to_device_plugin_*`: from sending a sim fault command to the health agent to the
ListAndWatch message showing the device Unhealthy at the kubelet (health agent, health KV,
allocation agent, gRPC stream); devices are used in turn and reused only once healthy again.
`dp_allocate_*`: one Allocate of two devices through the kubelet's stub; its floor, measured
interleaved in the same run, is a bare gRPC unary echo over a unix socket (an Allocate does
no other I/O).

Run alone: `python -m bench.device_plugin [--out bench/results.json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.stats import percentile
from devcluster import flow
from devcluster.deviceplugin_kubelet import DevicePluginKubelet
from devcluster.stack import LocalStack, StackConfig
from services.allocation.config import AllocationConfig
from services.allocation.deviceplugin.agent import DevicePluginAgent
from shared.bus import codec
from shared.bus.connection import Bus
from shared.bus.session import open_bus
from shared.config import LogSettings
from shared.errors import BusUnavailableError
from shared.logging import configure as configure_logging
from shared.pb.drasuite.v1 import health_pb2
from shared.supervisor import run_agent

__all__ = ["DevicePluginFigures", "measure_device_plugin"]

DRIVER = "sim.dra-suite.io"
NODE = "bench-node"
RESOURCE = f"{DRIVER}/npu"
_ECHO = "/bench.Echo/Echo"


@dataclass(frozen=True, slots=True)
class DevicePluginFigures:
    fault_ms: list[float]
    allocate_ms: list[float]
    floor_ms: list[float]

    def as_results(self) -> dict[str, float]:
        return {
            "fault_to_device_plugin_p50_ms": round(percentile(self.fault_ms, 50), 3),
            "fault_to_device_plugin_p99_ms": round(percentile(self.fault_ms, 99), 3),
            "fault_to_device_plugin_samples": len(self.fault_ms),
            "dp_allocate_p50_ms": round(percentile(self.allocate_ms, 50), 3),
            "dp_allocate_p99_ms": round(percentile(self.allocate_ms, 99), 3),
            "dp_allocate_floor_p50_ms": round(percentile(self.floor_ms, 50), 3),
            "dp_allocate_floor_p99_ms": round(percentile(self.floor_ms, 99), 3),
            "dp_allocate_samples": len(self.allocate_ms),
        }


@contextlib.asynccontextmanager
async def _echo_floor(socket_path: Path) -> AsyncIterator[Callable[[], Awaitable[float]]]:
    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(_ECHO)

            async def once() -> float:
                start = time.perf_counter()
                await call(b"x" * 32)
                return (time.perf_counter() - start) * 1000

            yield once
    finally:
        await server.stop(0)


async def _command(bus: Bus, stack: StackConfig, device: str, *, clear: bool) -> None:
    command = health_pb2.FaultCommand(device=device, clear=clear, cause="xid", code="79")
    subject = bus.names.fault_control(stack.driver_name, stack.node_name)
    for _ in range(100):
        try:
            await bus.request(subject, codec.encode(command), timeout_s=5.0)
            return
        except BusUnavailableError:  # the health agent has not subscribed yet
            await asyncio.sleep(0.1)
    raise RuntimeError(f"no health agent answers on {subject}")


async def _fault_round(
    bus: Bus, stack: StackConfig, kubelet: DevicePluginKubelet, device: str
) -> float:
    await kubelet.wait_for_devices(RESOURCE, lambda d: d.get(device) == "Healthy", timeout_s=60)
    endpoint = kubelet.endpoint(RESOURCE)
    seen = len(endpoint.updates)
    start = time.monotonic()
    await _command(bus, stack, device, clear=False)
    await kubelet.wait_for_devices(RESOURCE, lambda d: d.get(device) == "Unhealthy")
    arrived = next(
        u.received_s for u in endpoint.updates[seen:] if u.health.get(device) == "Unhealthy"
    )
    await _command(bus, stack, device, clear=True)
    return (arrived - start) * 1000


async def _allocations(
    kubelet: DevicePluginKubelet, names: list[str], *, count: int, socket: Path
) -> tuple[list[float], list[float]]:
    allocate_ms: list[float] = []
    floor_ms: list[float] = []
    async with _echo_floor(socket) as floor:
        for i in range(count):
            floor_ms.append(await floor())
            pair = [names[(2 * i) % len(names)], names[(2 * i + 1) % len(names)]]
            start = time.perf_counter()
            await kubelet.allocate(RESOURCE, [pair])
            allocate_ms.append((time.perf_counter() - start) * 1000)
    return allocate_ms, floor_ms


async def measure_device_plugin(
    *, workdir: Path, faults: int = 100, allocations: int = 1000
) -> DevicePluginFigures:
    stack = StackConfig(
        workdir=workdir / "stack",
        node_name=NODE,
        sim_profile="ascend-310p-duo",
        log_level="warning",
    )
    async with LocalStack(stack) as local, open_bus(local.nats_settings) as bus:
        inventory = await flow.wait_inventory(bus, driver=stack.driver_name, node=NODE)
        names = [d.name for d in inventory.devices]
        config = AllocationConfig(
            nats=local.nats_settings,
            node_name=NODE,
            driver_name=stack.driver_name,
            kubelet_api="device-plugin",
            plugin_registry_dir=workdir / "dp-registry",
            plugin_data_dir=workdir / "dp-data",
            device_plugin_dir=workdir / "dp",
            cdi_root=workdir / "dp-cdi",
        )
        kubelet = DevicePluginKubelet(config.device_plugin_dir)
        await kubelet.start()
        stop = asyncio.Event()
        runner = asyncio.create_task(
            run_agent(DevicePluginAgent(config), grace_s=5, stop=stop, handle_signals=False),
            name="dp-agent",
        )
        try:
            await kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == len(names), timeout_s=30)
            fault_ms = [
                await _fault_round(bus, stack, kubelet, names[i % len(names)])
                for i in range(faults)
            ]
            allocate_ms, floor_ms = await _allocations(
                kubelet, names, count=allocations, socket=workdir / "floor.sock"
            )
        finally:
            stop.set()
            await asyncio.wait_for(runner, 15)
            await kubelet.stop()
    return DevicePluginFigures(fault_ms=fault_ms, allocate_ms=allocate_ms, floor_ms=floor_ms)


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.device_plugin")
    parser.add_argument("--out", type=Path, default=None, help="merge the figures into this file")
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--allocations", type=int, default=1000)
    args = parser.parse_args()
    configure_logging(LogSettings(level="warning", format="console"), service="bench")

    async def run() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="dra-bench-dp-", dir="/tmp") as tmp:
            figures = await measure_device_plugin(
                workdir=Path(tmp), faults=args.faults, allocations=args.allocations
            )
        return figures.as_results()

    results = asyncio.run(run())
    if args.out is not None:
        merged = json.loads(args.out.read_text()) if args.out.exists() else {}
        merged.update(results)
        args.out.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    print(json.dumps(results, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
