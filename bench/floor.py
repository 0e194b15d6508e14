"""The floor under a prepare: what no implementation of NodePrepareResources can beat.

One iteration = a bare gRPC unary echo over a unix socket + one GET to the API emulator + one
fsync'ed atomic file write. The prepare bench interleaves floor iterations with its prepares,
so that both see the same machine: a burst of disk or CPU noise lands on both, not on one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc

from shared import atomicfile

__all__ = ["FloorIteration", "floor_probe"]

_ECHO_METHOD = "/bench.Echo/Echo"

FloorIteration = Callable[[], Awaitable[float]]


def _echo_handler() -> grpc.GenericRpcHandler:
    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    return grpc.method_handlers_generic_handler(
        "bench.Echo",
        {"Echo": grpc.unary_unary_rpc_method_handler(echo)},
    )


@contextlib.asynccontextmanager
async def floor_probe(*, workdir: Path, get_url: str) -> AsyncIterator[FloorIteration]:
    """A function that runs one floor iteration and returns its milliseconds."""
    socket_path = workdir / "floor.sock"
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_echo_handler(),))
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    try:
        async with (
            grpc.aio.insecure_channel(f"unix://{socket_path}") as channel,
            aiohttp.ClientSession() as http,
        ):
            echo: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(_ECHO_METHOD)

            async def once() -> float:
                start = time.perf_counter()
                await echo(b"x" * 64)
                async with http.get(get_url) as response:
                    await response.read()
                atomicfile.write_atomic(workdir / "floor.json", b'{"claim": "x"}' * 20)
                return (time.perf_counter() - start) * 1000

            yield once
    finally:
        await server.stop(None)
