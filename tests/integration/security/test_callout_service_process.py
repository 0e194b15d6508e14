"""`dra-nats-auth serve` as the Deployment runs it: a process configured by env twins, with its
ops port (/healthz, /readyz, /metrics counting decisions) and a clean stop."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from devcluster.apiserver import APIServerEmulator
from devcluster.processes import ChildProcess
from tests.integration.security.callout_stack import (
    DRIVER,
    callout_stack,
    connected,
    refused_connect,
)
from tests.integration.security.secure_nats import eventually

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as answer,
    ):
        return answer.status, await answer.text()


async def test_the_service_process_admits_refuses_and_counts(
    kube: APIServerEmulator, tmp_path: Path
):
    async with callout_stack(kube, tmp_path, in_process=False) as stack:
        config = stack.config
        assert config is not None
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
        env |= {
            "NATS_URL": config.nats.url, "NATS_USER": config.nats.user,
            "NATS_PASSWORD_FILE": config.nats.password_file,
            "ISSUER_SEED_FILE": config.issuer_seed_file, "XKEY_SEED_FILE": config.xkey_seed_file,
            "KUBECONFIG": config.kube.kubeconfig, "OPERATOR_USERS": ",".join(config.operator_users),
            "DRIVER_NAME": DRIVER, "OPS_HOST": "127.0.0.1", "OPS_PORT": str(port),
            "LOG_FORMAT": "json",
        }  # fmt: skip
        service = ChildProcess(
            name="dra-nats-auth",
            argv=[sys.executable, "-m", "services.natsauth", "serve"],
            log_path=tmp_path / "dra-nats-auth.log",
            env=env,
        )
        await service.start()
        try:
            await eventually(lambda: '"event": "nats_auth_serving"' in _log(service), timeout_s=20)
            assert (await _get(port, "/healthz"))[0] == 200
            for _ in range(100):  # ready once it provisioned the streams, through itself
                if (await _get(port, "/readyz"))[0] == 200:
                    break
                await asyncio.sleep(0.1)
            assert (await _get(port, "/readyz"))[0] == 200
            settings = await stack.agent_settings("dra-health", "node-a")
            async with connected(settings, component="health", node="node-a"):
                pass
            assert "authorization violation" in await refused_connect(stack, None)
            _, metrics = await _get(port, "/metrics")
            decisions = [line for line in metrics.splitlines() if "dra_nats_auth_decisions" in line]
            assert any('outcome="allowed"' in d and 'role="health"' in d for d in decisions)
            assert any('outcome="refused"' in d and 'reason="no_token"' in d for d in decisions)
        finally:
            assert await service.stop() == 0, _log(service)
        assert "system:serviceaccount" in _log(service)  # who was admitted is in the log


def _log(process: ChildProcess) -> str:
    path = process.log_path
    return path.read_text(errors="replace") if path.exists() else ""
