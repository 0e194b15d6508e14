"""The dev nats-server's auth config: what it renders and which combinations it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster.natsauth import AuthCallout, JWTTrust, ServerAuth, ServerTLS, render_config
from devcluster.natsserver import NATSServerProcess


def test_users_nkeys_and_mutual_tls_render_into_one_config():
    tls = ServerTLS(
        cert_file=Path("/pki/server.pem"),
        key_file=Path("/pki/server-key.pem"),
        ca_file=Path("/pki/ca.pem"),
        verify_clients=True,
    )
    text = render_config(ServerAuth(users={"agent": 'p"w'}, nkeys=("UABC",), tls=tls))
    assert '{user: "agent", password: "p\\"w"}' in text
    assert '{nkey: "UABC"}' in text
    assert 'ca_file: "/pki/ca.pem"' in text
    assert "verify: true" in text


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ServerAuth(token="t", users={"a": "b"}), "token or a users list"),
        (lambda: ServerAuth(nkeys=("SUABC",)), "public user keys"),
        (
            lambda: ServerAuth(
                token="t", jwt=JWTTrust(operator_jwt="o", system_account="A", account_jwts={})
            ),
            "JWT trust replaces",
        ),
        (
            lambda: ServerTLS(cert_file=Path("c"), key_file=Path("k"), verify_clients=True),
            "needs the ca_file",
        ),
    ],
)
def test_contradictory_auth_is_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_without_auth_the_server_keeps_its_plain_url(tmp_path):
    assert NATSServerProcess(tmp_path).url.startswith("nats://")
    tls = ServerTLS(cert_file=Path("c"), key_file=Path("k"))
    assert NATSServerProcess(tmp_path, auth=ServerAuth(tls=tls)).url.startswith("tls://")


def test_auth_callout_renders_config_mode_accounts_and_the_callout_block():
    callout = AuthCallout(issuer="AISSUER", auth_password="pw", xkey="XKEY")
    text = render_config(ServerAuth(callout=callout))
    assert "DRA: {\n    jetstream: { max_memory: 512MB, max_file: 1280MB" in text
    assert '{user: "dra-nats-auth", password: "pw"}' in text
    assert "system_account: SYS" in text
    assert 'issuer: "AISSUER"' in text
    assert 'auth_users: ["dra-nats-auth"]' in text
    assert "account: AUTH" in text
    assert 'xkey: "XKEY"' in text
    assert "xkey" not in render_config(
        ServerAuth(callout=AuthCallout(issuer="A", auth_password="p"))
    )


def test_auth_callout_takes_no_other_auth():
    with pytest.raises(ValueError, match="callout"):
        ServerAuth(token="t", callout=AuthCallout(issuer="A", auth_password="p"))
