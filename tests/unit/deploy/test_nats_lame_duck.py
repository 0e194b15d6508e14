"""NATS leaves in lame-duck mode: the StatefulSet's preStop, run against the pinned nats-server,
makes the server ignore the kubelet's SIGTERM that follows and close its clients itself before
it exits; the grace period covers it. Without the hook the same SIGTERM stops it at once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from devcluster.natsserver import NATSServerProcess, find_binary
from tests.unit.deploy.manifests import KUSTOMIZE, _docs

GRACE_S = 1  # lame_duck_grace_period here; nats-server's default is 10 s
DEFAULT_GRACE_S, DEFAULT_DURATION_S = 10, 120  # nats-server's defaults, as the base runs it


def _nats_pod() -> dict[str, Any]:
    (statefulset,) = [
        d for d in _docs(KUSTOMIZE / "base" / "nats.yaml") if d["kind"] == "StatefulSet"
    ]
    return dict(statefulset["spec"]["template"]["spec"])


def _pre_stop(pid: int) -> list[str]:
    """The hook's command, run on this machine against the server with `pid` (1 in the pod)."""
    (container,) = [c for c in _nats_pod()["containers"] if c["name"] == "nats"]
    command = list(container["lifecycle"]["preStop"]["exec"]["command"])
    assert command == ["nats-server", "--signal", "ldm=1"]
    return [find_binary(), *command[1:-1], f"ldm={pid}"]


def _server(tmp_path: Path) -> NATSServerProcess:
    config = tmp_path / "lame-duck.conf"
    config.write_text(f'lame_duck_duration: "30s"\nlame_duck_grace_period: "{GRACE_S}s"\n')
    server = NATSServerProcess(tmp_path / "store", extra_args=("--config", str(config)))
    server.start()
    return server


async def _until_logged(server: NATSServerProcess, text: str, *, timeout_s: float) -> None:
    started = time.monotonic()
    while text not in server.log_text():
        assert time.monotonic() - started < timeout_s, f"nats-server never logged {text!r}"
        await asyncio.sleep(0.02)


async def _wait_stopped(server: NATSServerProcess, timeout_s: float) -> float:
    started = time.monotonic()
    while server.running:
        assert time.monotonic() - started < timeout_s, "nats-server did not exit"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_pre_stop_makes_the_server_close_its_clients_before_it_exits(
    tmp_path: Path,
) -> None:
    server = _server(tmp_path)
    closed: list[float] = []

    async def on_disconnect() -> None:
        closed.append(time.monotonic())

    clients = [
        await nats.connect(
            server.url, allow_reconnect=False, disconnected_cb=on_disconnect, connect_timeout=5
        )
        for _ in range(3)
    ]
    try:
        assert server.pid is not None
        hook = await asyncio.create_subprocess_exec(*_pre_stop(server.pid))
        assert await asyncio.wait_for(hook.wait(), timeout=10) == 0
        # The hook only sends SIGUSR2; on a loaded machine the server may not have acted on it
        # yet when the hook returns, while the kubelet takes its time to send SIGTERM.
        await _until_logged(server, "Entering lame duck mode", timeout_s=10)
        os.kill(server.pid, signal.SIGTERM)  # what the kubelet sends once the hook returned
        await asyncio.sleep(GRACE_S / 2)
        assert server.running, "lame duck ignores SIGTERM"
        assert closed == []
        await _wait_stopped(server, timeout_s=30)
        await asyncio.sleep(0.2)
        assert len(closed) == len(clients), "the server closed every client before it exited"
    finally:
        for client in clients:
            await client.close()
        server.stop()


async def test_without_the_hook_sigterm_stops_the_server_at_once(tmp_path: Path) -> None:
    server = _server(tmp_path)
    client = await nats.connect(server.url, allow_reconnect=False, connect_timeout=5)
    try:
        assert server.pid is not None
        os.kill(server.pid, signal.SIGTERM)
        assert await _wait_stopped(server, timeout_s=5) < GRACE_S
    finally:
        await client.close()
        server.stop()


def test_the_grace_period_covers_nats_servers_default_lame_duck() -> None:
    assert _nats_pod()["terminationGracePeriodSeconds"] > DEFAULT_GRACE_S + DEFAULT_DURATION_S


@pytest.mark.parametrize("kind", ["nats-server", "nats-auth"])
def test_the_bus_is_preempted_last(kind: str) -> None:
    path = KUSTOMIZE / "base" / ("nats.yaml" if kind == "nats-server" else "nats-auth.yaml")
    (workload,) = [d for d in _docs(path) if d["kind"] in ("StatefulSet", "Deployment")]
    assert workload["spec"]["template"]["spec"]["priorityClassName"] == "system-cluster-critical"
