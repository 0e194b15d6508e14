"""The Bus against a real nats-server that requires TLS, and mutual TLS (certificates: trustme).

The server's certificate is checked against `--nats-tls-ca-file`; with client verification
on, the Bus shows its own certificate. A certificate nobody trusts is refused on either side:
logged as a TLS failure, retried, never a crash.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from devcluster.natsauth import ServerAuth, ServerTLS
from devcluster.natsserver import NATSServerProcess
from shared.config import NATSSettings
from tests.integration.security.secure_nats import (
    PKI,
    eventually,
    exercise,
    logged,
    running_bus,
)

pytestmark = pytest.mark.integration


def _tls(pki: PKI, *, verify_clients: bool = False) -> ServerTLS:
    return ServerTLS(
        cert_file=pki.server_cert,
        key_file=pki.server_key,
        ca_file=pki.ca if verify_clients else None,
        verify_clients=verify_clients,
    )


def _client(server: NATSServerProcess, pki: PKI, **fields: str) -> NATSSettings:
    given: dict[str, Any] = {"tls_ca_file": str(pki.ca), **fields}
    return NATSSettings(url=server.url, namespace="tls", connect_timeout_s=1.0, **given)


@pytest.mark.parametrize("scheme", ["tls", "nats"])
async def test_tls_with_the_servers_ca_gives_kv_and_jetstream(pki, secured_nats, scheme):
    """tls:// or nats://: the CA file alone turns TLS on, and the server requires it anyway."""
    server = secured_nats(ServerAuth(tls=_tls(pki)))
    assert server.url.startswith("tls://")
    url = server.url.replace("tls://", f"{scheme}://")
    settings = NATSSettings(url=url, namespace="tls", tls_ca_file=str(pki.ca))
    async with running_bus(settings) as run:
        await eventually(run.bus.connected.is_set)
        await exercise(run.bus)


async def test_a_token_over_tls(pki, secured_nats, tmp_path, bus_events):
    token = secrets.token_hex(16)
    server = secured_nats(ServerAuth(token=token, tls=_tls(pki)))
    token_file = tmp_path / "token"
    token_file.write_text(token)
    async with running_bus(_client(server, pki, token_file=str(token_file))) as run:
        await eventually(run.bus.connected.is_set)
        await exercise(run.bus)
    assert token not in repr(bus_events)


async def test_mutual_tls_with_a_client_certificate(pki, secured_nats):
    server = secured_nats(ServerAuth(tls=_tls(pki, verify_clients=True)))
    settings = _client(
        server, pki, tls_cert_file=str(pki.client_cert), tls_key_file=str(pki.client_key)
    )
    async with running_bus(settings) as run:
        await eventually(run.bus.connected.is_set)
        await exercise(run.bus)


@pytest.mark.parametrize(
    "client_cert",
    [None, "rogue"],
    ids=["without a client certificate", "with a certificate of another CA"],
)
async def test_mutual_tls_refuses_an_unknown_client_and_the_bus_keeps_trying(
    pki, secured_nats, bus_events, client_cert
):
    server = secured_nats(ServerAuth(tls=_tls(pki, verify_clients=True)))
    fields = {}
    if client_cert == "rogue":
        fields = {
            "tls_cert_file": str(pki.rogue_client_cert),
            "tls_key_file": str(pki.rogue_client_key),
        }
    async with running_bus(_client(server, pki, **fields)) as run:
        [failed, *_] = await eventually(lambda: logged(bus_events, "nats_tls_failed"))
        assert failed["log_level"] == "error"
        assert not run.task.done()
        assert not run.bus.connected.is_set()
    key_text = pki.rogue_client_key.read_text() + pki.client_key.read_text()
    assert not any(line in repr(bus_events) for line in key_text.splitlines()[1:-1])


@pytest.mark.parametrize("ca", ["rogue", "system"], ids=["another CA", "the system CAs"])
async def test_a_server_certificate_nobody_vouches_for_is_refused(
    pki, secured_nats, bus_events, ca
):
    server = secured_nats(ServerAuth(tls=_tls(pki)))
    fields: dict[str, Any] = {"tls_ca_file": str(pki.rogue_ca)} if ca == "rogue" else {}
    settings = NATSSettings(url=server.url, namespace="tls", connect_timeout_s=1.0, **fields)
    async with running_bus(settings) as run:
        [failed, *_] = await eventually(lambda: logged(bus_events, "nats_tls_failed"))
        assert "certificate verify failed" in failed["error"]
        assert not run.task.done()
        assert not run.bus.connected.is_set()
