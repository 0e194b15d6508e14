"""What the NATS security tests share: a throwaway PKI (trustme), private servers that demand
credentials or certificates, a Bus run in the background, and a look at what it logged."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trustme

from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.supervisor import Agent, run_agent

__all__ = ["PKI", "BusRun", "eventually", "exercise", "logged", "running_agents", "running_bus"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PKI:
    """PEM files: a CA, the server's certificate for 127.0.0.1, a client's, and a stranger's
    (a client certificate signed by another CA)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca: Path
    rogue_client_cert: Path
    rogue_client_key: Path

    @classmethod
    def create(cls, directory: Path) -> PKI:
        directory.mkdir(parents=True, exist_ok=True)
        ca, rogue = trustme.CA(), trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert("dra-agent@dra-suite.io")
        stranger = rogue.issue_cert("intruder@example.com")
        files = {
            "ca": ca.cert_pem,
            "server_cert": server.cert_chain_pems[0],
            "server_key": server.private_key_pem,
            "client_cert": client.cert_chain_pems[0],
            "client_key": client.private_key_pem,
            "rogue_ca": rogue.cert_pem,
            "rogue_client_cert": stranger.cert_chain_pems[0],
            "rogue_client_key": stranger.private_key_pem,
        }
        paths = {}
        for name, blob in files.items():
            paths[name] = directory / f"{name}.pem"
            blob.write_to_path(str(paths[name]))
        return cls(**paths)


async def eventually(check: Callable[[], T | None], *, timeout_s: float = 10.0) -> T:
    """The first truthy result of `check`, polled until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.02)


@dataclass
class BusRun:
    bus: Bus
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def running_bus(
    settings: NATSSettings, *, name: str = "security-test"
) -> AsyncIterator[BusRun]:
    """A Bus whose `run()` is under way (connected or still trying); closed afterwards."""
    bus = Bus(settings, name=name)
    task = asyncio.create_task(bus.run(), name="bus-connector")
    try:
        yield BusRun(bus, task)
    finally:
        await bus.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def running_agents(*agents: Agent) -> AsyncIterator[None]:
    """`agents` in this process, once all are ready; each must stop cleanly (exit 0)."""
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(run_agent(agent, grace_s=5, stop=stop, handle_signals=False))
        for agent in agents
    ]
    try:
        await eventually(
            lambda: all(a.ready.is_set() for a in agents) or any(t.done() for t in tasks),
            timeout_s=15,
        )
        assert not any(t.done() for t in tasks), "an agent stopped during start"
        yield
    finally:
        stop.set()
        assert [await asyncio.wait_for(task, 15) for task in tasks] == [0] * len(agents)


async def exercise(bus: Bus) -> None:
    """KV and JetStream work, as the agents do it: bucket, put/get, stream, deduplicated publish."""
    bucket = bus.names.inventory_bucket
    await bus.kv_put(bucket, "drv.node-a", b"inventory")
    assert await bus.kv_get(bucket, "drv.node-a") == b"inventory"
    await bus.ensure_stream(
        name=bus.names.alerts_stream,
        subjects=[bus.names.alerts_wildcard],
        max_age_s=60,
        duplicate_window_s=60,
    )
    first = await bus.publish_js(bus.names.alerts("drv", "node-a"), b"alert", msg_id="a-1")
    again = await bus.publish_js(bus.names.alerts("drv", "node-a"), b"alert", msg_id="a-1")
    assert first == again


def logged(events: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in events if e.get("event") == name]
