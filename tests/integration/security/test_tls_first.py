"""Attack 1: whoever answers first gets no credential.

A fake server in the network path sends a plaintext INFO without `tls_required`. nats-py on its
own would then send CONNECT with the token or password in clear; every client of ours (the Bus
of the agents, dractl and dra-nats-auth) does the TLS handshake first and sends nothing but a
ClientHello to a peer without the cluster's certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import nats.aio.client
import nats.errors
import pytest

from devcluster.natsauth import ServerAuth, ServerTLS
from devcluster.natsserver import NATSServerProcess
from shared import nats_auth
from shared.config import NATSSettings
from tests.integration.security.secure_nats import PKI, eventually, running_bus

pytestmark = pytest.mark.integration

SECRET = "a-projected-serviceaccount-token-0123456789"
_INFO = {"server_id": "FAKE", "version": "2.15.1", "proto": 1, "max_payload": 1048576,
         "auth_required": True, "headers": True}  # fmt: skip
_TLS_HANDSHAKE = 0x16


@dataclass
class FakeServer:
    """Answers every connection with a plaintext INFO and keeps what the client sends."""

    port: int = 0
    received: list[bytes] = field(default_factory=list)

    @property
    def everything(self) -> bytes:
        return b"".join(self.received)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(b"INFO " + json.dumps(_INFO).encode() + b"\r\n")
            await writer.drain()
            while data := await asyncio.wait_for(reader.read(65536), 3):
                self.received.append(data)
        except (OSError, TimeoutError):
            pass  # the client gave up, as it should
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def fake_server() -> AsyncIterator[FakeServer]:
    fake = FakeServer()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    fake.port = server.sockets[0].getsockname()[1]
    async with server:
        yield fake


def _secret_files(tmp_path: Path) -> dict[str, str]:
    token, password = tmp_path / "token", tmp_path / "password"
    token.write_text(SECRET + "\n")
    password.write_text(SECRET + "\n")
    return {"token": str(token), "password": str(password)}


@pytest.mark.parametrize("how", ["token", "password"], ids=["agent token", "auth service user"])
@pytest.mark.parametrize("scheme", ["tls", "nats"])
async def test_no_credential_reaches_a_server_that_does_not_start_tls(
    how: str, scheme: str, pki: PKI, tmp_path: Path
) -> None:
    files = _secret_files(tmp_path)
    async with fake_server() as fake:
        url = f"{scheme}://127.0.0.1:{fake.port}"
        ca = str(pki.ca)
        if how == "token":
            settings = NATSSettings(
                url=url, tls_ca_file=ca, connect_timeout_s=1.0, token_file=files["token"]
            )
        else:
            settings = NATSSettings(
                url=url, tls_ca_file=ca, connect_timeout_s=1.0, user="dra-nats-auth",
                password_file=files["password"],
            )  # fmt: skip
        async with running_bus(settings) as run:
            await eventually(lambda: fake.everything, timeout_s=10)
            await asyncio.sleep(0.5)
            assert not run.bus.connected.is_set()
    sent = fake.everything
    assert sent[0] == _TLS_HANDSHAKE  # a ClientHello, nothing in clear
    assert SECRET.encode() not in sent
    assert b"CONNECT" not in sent


async def test_without_handshake_first_nats_py_would_send_the_token_in_clear(
    pki: PKI, tmp_path: Path
) -> None:
    """The fake server is a real threat: the options minus handshake-first leak the token."""
    settings = NATSSettings(token_file=_secret_files(tmp_path)["token"], tls_ca_file=str(pki.ca))
    options = nats_auth.connect_options(settings)
    assert options.pop("tls_handshake_first") is True
    async with fake_server() as fake:
        nc = nats.aio.client.Client()
        try:
            await nc.connect(
                f"tls://127.0.0.1:{fake.port}", allow_reconnect=False, connect_timeout=1,
                max_reconnect_attempts=0, **options,
            )  # fmt: skip
        except (nats.errors.Error, OSError, TimeoutError):
            pass  # the fake cannot complete the connection; what it received counts
        finally:
            await nc.close()  # also releases the socket of a failed attempt
        await eventually(lambda: fake.everything, timeout_s=5)
    assert SECRET.encode() in fake.everything


async def test_the_bus_gets_in_over_a_handshake_first_server(
    pki: PKI, secured_nats: object, tmp_path: Path
) -> None:
    tls = ServerTLS(cert_file=pki.server_cert, key_file=pki.server_key, ca_file=pki.ca)
    start = secured_nats
    assert callable(start)
    server: NATSServerProcess = start(ServerAuth(tls=tls))
    assert "handshake_first: true" in server.config_path.read_text()
    settings = NATSSettings(url=server.url, namespace="tls1", tls_ca_file=str(pki.ca))
    async with running_bus(settings) as run:
        await asyncio.wait_for(run.bus.connected.wait(), 10)
        await run.bus.kv_put(run.bus.names.inventory_bucket, "drv.node-a", b"over tls first")
