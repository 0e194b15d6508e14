"""A connect given up half-way (the agent stops, or the server refuses the credentials) closes
its socket: nats-py alone leaves it open for the garbage collector to find."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from shared.bus.connection import Bus
from shared.config import NATSSettings

_INFO = {"server_id": "HANGS", "version": "2.15.1", "proto": 1, "max_payload": 1048576}


class _SilentServer:
    """Sends INFO, then never answers the client's PING: the connect hangs half-way."""

    def __init__(self) -> None:
        self.accepted = asyncio.Event()
        self.closed_by_client = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(f"INFO {json.dumps(_INFO)}\r\n".encode())
        await writer.drain()
        self.accepted.set()
        while await reader.read(4096):
            pass  # CONNECT and PING arrive; no PONG ever goes back
        self.closed_by_client.set()
        writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        try:
            yield f"nats://127.0.0.1:{port}"
        finally:
            self._server.close()


@pytest.mark.parametrize("stop", ["cancel", "connect_timeout"])
async def test_a_connect_given_up_half_way_closes_its_socket(stop: str) -> None:
    server = _SilentServer()
    async with server.running() as url:
        timeout_s = 0.3 if stop == "connect_timeout" else 30.0
        bus = Bus(NATSSettings(url=url, connect_timeout_s=timeout_s), name="abandoned")
        runner = asyncio.create_task(bus.run())
        try:
            await asyncio.wait_for(server.accepted.wait(), 5)
            if stop == "cancel":
                runner.cancel()
            # Cancelled: the socket closes with the stop. Timed out: nats-py gives the attempt
            # up and the next attempt opens a new socket; the old one is closed either way.
            await asyncio.wait_for(server.closed_by_client.wait(), 5)
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        assert not bus.connected.is_set()


class _MuteServer:
    """Accepts TCP and never says a word: a TLS handshake with it times out."""

    def __init__(self) -> None:
        self.accepts = 0
        self.accepted_again = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepts += 1
        if self.accepts > 1:
            self.accepted_again.set()
        while await reader.read(4096):
            pass
        writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[int]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        try:
            yield server.sockets[0].getsockname()[1]
        finally:
            server.close()


async def test_a_tls_handshake_that_times_out_does_not_stop_the_connect_for_good(
    tmp_path: Path,
) -> None:
    # nats-py alone waits for ever after such a handshake (see shared.bus.connect_watch).
    ca = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca))
    server = _MuteServer()
    async with server.running() as port:
        settings = NATSSettings(
            url=f"tls://127.0.0.1:{port}", tls_ca_file=str(ca), connect_timeout_s=0.2
        )
        bus = Bus(settings, name="handshake-timeout")
        runner = asyncio.create_task(bus.run())
        try:
            await asyncio.wait_for(server.accepted_again.wait(), 10)
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        assert not bus.connected.is_set()


class _DroppingServer:
    """Serves the first connection until the client is connected, then hangs up; every later
    connection gets INFO and silence, so each reconnect attempt times out. Records, per
    connection, whether the client closed its end."""

    def __init__(self) -> None:
        self.closed_by_client: list[asyncio.Event] = []
        self.third_attempt = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        closed = asyncio.Event()
        self.closed_by_client.append(closed)
        writer.write(f"INFO {json.dumps(_INFO)}\r\n".encode())
        if len(self.closed_by_client) == 1:
            received = b""
            while b"PING\r\n" not in received:
                received += await reader.read(4096)
            writer.write(b"PONG\r\n")
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.close()
            return
        if len(self.closed_by_client) == 4:
            self.third_attempt.set()
        while await reader.read(4096):
            pass
        closed.set()
        writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        try:
            yield f"nats://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        finally:
            server.close()


async def test_each_failed_reconnect_attempt_closes_its_socket_before_the_next_one() -> None:
    # nats-py opens each reconnect attempt on the previous attempt's transport and leaves
    # the old socket to the garbage collector: one open file per attempt through an outage.
    server = _DroppingServer()
    async with server.running() as url:
        bus = Bus(NATSSettings(url=url, connect_timeout_s=0.2), name="reconnecting")
        runner = asyncio.create_task(bus.run())
        try:
            await asyncio.wait_for(server.third_attempt.wait(), 10)
            earlier_attempts = server.closed_by_client[1:3]
            await asyncio.wait_for(asyncio.gather(*(c.wait() for c in earlier_attempts)), 2)
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
            await bus.close()
