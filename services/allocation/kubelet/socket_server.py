"""One gRPC server on one unix socket: start (stale file removed, bound, owner-only), wait for
its end, stop (with grace; the socket file removed unless another process now serves on it).
The filesystem part lives in `sockets`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc
import structlog

from services.allocation.kubelet import sockets
from services.allocation.kubelet.decode_guard import DecodeGuard
from shared.errors import SocketBindError

__all__ = ["AddServices", "start", "stop", "until_terminated"]

log = structlog.get_logger(__name__)

AddServices = Callable[[grpc.aio.Server], None]


async def start(path: Path, add_services: AddServices) -> grpc.aio.Server:
    """Serve the services on the unix socket `path`; the caller must `stop` it."""
    await asyncio.to_thread(sockets.clear_stale, path)
    staged = sockets.staging_path(path)
    server = grpc.aio.server(interceptors=[DecodeGuard()])
    add_services(server)
    try:
        server.add_insecure_port(sockets.address(staged))
    except RuntimeError as exc:
        raise SocketBindError(f"socket {path}: bind failed: {exc}", path=str(path)) from exc
    await server.start()
    try:
        sockets.restrict(staged)
        await asyncio.to_thread(sockets.publish, staged, path)
    except SocketBindError:
        await server.stop(0)  # gRPC removes the staging path; `path` is not ours
        raise
    log.info("socket_serving", path=str(path))
    return server


async def stop(server: grpc.aio.Server, path: Path, *, grace_s: float) -> None:
    """Stop serving (calls in flight get `grace_s`) and remove the socket file, unless another
    process serves on it now: then it is that process's file, not ours."""
    await server.stop(grace_s)  # gRPC unlinks the staging path, long renamed
    if await asyncio.to_thread(sockets.serving, path):
        log.warning("socket_left_to_its_server", path=str(path))
        return
    sockets.remove(path)
    log.info("socket_closed", path=str(path))


async def until_terminated(server: grpc.aio.Server) -> None:
    """Return when the server stops (or raise its crash); cancelling this leaves it serving.

    Without a timeout, wait_for_termination() awaits the server's shutdown future itself, and
    cancelling the waiter would cancel that future and break the later stop(); with one, it is
    shielded. It returns True while the server is still serving.
    """
    while await server.wait_for_termination(timeout=3600):
        pass
