"""Smoke: an agent connects through dra-nats-auth and writes its own inventory key, on a plain
and on a TLS-only server (as the base deployment runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster.apiserver import APIServerEmulator
from devcluster.natsauth import ServerTLS
from tests.integration.security.callout_stack import DRIVER, callout_stack, connected

pytestmark = pytest.mark.integration


async def test_agent_writes_its_inventory(kube: APIServerEmulator, tmp_path: Path):
    async with callout_stack(kube, tmp_path) as stack:
        settings = await stack.agent_settings("dra-discovery", "node-a")
        async with connected(settings, component="discovery", node="node-a") as bus:
            key = bus.names.inventory_key(DRIVER, "node-a")
            await bus.kv_put(bus.names.inventory_bucket, key, b"inv")
            assert await bus.kv_get(bus.names.inventory_bucket, key) == b"inv"


async def test_agent_connects_over_tls_with_its_token(kube: APIServerEmulator, tmp_path: Path, pki):
    tls = ServerTLS(cert_file=pki.server_cert, key_file=pki.server_key, ca_file=pki.ca)
    async with callout_stack(kube, tmp_path, tls=tls) as stack:
        assert stack.server.url.startswith("tls://")
        settings = await stack.agent_settings("dra-health", "node-a")
        async with connected(settings, component="health", node="node-a") as bus:
            key = bus.names.health_key(DRIVER, "node-a", "gpu-0")
            await bus.kv_put(bus.names.health_bucket, key, b"over tls")
            assert await bus.kv_get(bus.names.health_bucket, key) == b"over tls"
