"""A node agent's identity is held to the app account's per-connection limits.

The callout's user JWTs carry per-role `subs`, `data` and `payload` limits, but nats-server
2.15 does not apply them to callout users; what bounds a compromised agent is the account
`DRA`'s `max_subscriptions` and `max_payload` (`devcluster.natsauth.APP_ACCOUNT_LIMITS`, as
deployed). The attacker holds node-a's health token and speaks to the server directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit

import nats.errors
import pytest

from devcluster.apiserver import APIServerEmulator
from devcluster.natsauth import APP_MAX_PAYLOAD, APP_MAX_SUBSCRIPTIONS
from services.natsauth.permissions import AGENT_LIMITS
from shared.bus.subjects import Names
from tests.integration.security.callout_stack import DRIVER, callout_stack, raw_client

pytestmark = pytest.mark.integration

N = Names("")
NODE = "node-a"


async def test_an_agent_cannot_hold_more_subscriptions_than_the_account_allows(
    kube: APIServerEmulator, tmp_path: Path
):
    async with callout_stack(kube, tmp_path) as stack:
        token = await stack.token("dra-health", node=NODE)
        inbox = N.inbox_prefix("health", NODE)
        async with raw_client(stack, token, inbox=inbox) as attacker:
            for index in range(APP_MAX_SUBSCRIPTIONS):
                await attacker.nc.subscribe(f"{inbox}.s{index}")
            await attacker.nc.flush(timeout=5)
            # Past the JWT's own limit and still connected: that limit is not what holds.
            assert AGENT_LIMITS.subs < APP_MAX_SUBSCRIPTIONS
            assert attacker.nc.is_connected, attacker.errors
            with contextlib.suppress(nats.errors.Error):  # closed before the flush returns
                await attacker.nc.subscribe(f"{inbox}.one-too-many")
                await attacker.nc.flush(timeout=5)
            await _until(lambda: not attacker.nc.is_connected)
            assert "maximum subscriptions exceeded" in str(attacker.nc.last_error).lower()


@contextlib.asynccontextmanager
async def _bare_client(
    url: str, token: str
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A socket past CONNECT, for what nats-py would refuse to send itself."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        await reader.readline()  # INFO
        connect = {"auth_token": token, "verbose": False, "pedantic": False, "protocol": 1}
        writer.write(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
        assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"PONG")
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_an_agent_cannot_publish_more_than_the_accounts_payload(
    kube: APIServerEmulator, tmp_path: Path
):
    async with callout_stack(kube, tmp_path) as stack:
        token = await stack.token("dra-health", node=NODE)
        alerts = N.alerts(DRIVER, NODE)  # a subject node-a's health agent may publish
        async with _bare_client(stack.server.url, token) as (reader, writer):
            # The server judges the size as the header comes in, before any payload byte.
            writer.write(f"PUB {alerts} {APP_MAX_PAYLOAD + 1}\r\n".encode())
            answer = await asyncio.wait_for(reader.readline(), 10)
            while answer.startswith(b"INFO"):  # the server's update after CONNECT
                answer = await asyncio.wait_for(reader.readline(), 10)
            assert b"maximum payload" in answer.lower(), answer
            assert await asyncio.wait_for(reader.read(), 10) == b""  # the server hung up


async def _until(seen: Callable[[], bool], *, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not seen():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("not within the time")
        await asyncio.sleep(0.05)
