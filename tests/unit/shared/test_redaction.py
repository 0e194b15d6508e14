"""Secret-looking keys and URL userinfo are masked; paths of secret files and the rest are not."""

from __future__ import annotations

import pytest

from shared.redaction import REDACTED, is_secret_key, redact, redact_url


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nats://agent:pw@10.0.0.1:4222", "nats://[REDACTED]@10.0.0.1:4222"),
        ("tls://s3cr3t-token@nats:4222", "tls://[REDACTED]@nats:4222"),
        (
            "nats://a:1@h1:4222,nats://h2:4222,nats://b:2@h3:4222",
            "nats://[REDACTED]@h1:4222,nats://h2:4222,nats://[REDACTED]@h3:4222",
        ),
        (
            "cannot reach NATS at nats://u:p@h:1 within 5s",
            "cannot reach NATS at nats://[REDACTED]@h:1 within 5s",
        ),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("mail agent@example.com", "mail agent@example.com"),
    ],
)
def test_url_userinfo_is_masked_wherever_a_url_appears(text, expected):
    assert redact_url(text) == expected


@pytest.mark.parametrize(
    "key",
    [
        *("password", "nats_password", "token", "auth_token", "secret", "client_secret"),
        *("seed", "nkey_seed", "creds", "credentials", "authorization", "api_key"),
        *("private_key", "jwt", "NatsPassword", "x-auth-token"),
    ],
)
def test_secret_looking_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        *("key", "claim_uid", "event", "error", "auth", "user", "path", "passed", "tokens"),
        *("password_file", "token_file", "nkey_seed_file", "creds_path", "secret_dir"),
    ],
)
def test_ordinary_keys_and_secret_file_paths_are_kept(key):
    assert not is_secret_key(key)


def test_redact_walks_mappings_and_sequences():
    event = {
        "event": "nats_connecting",
        "token": "t0k",
        "password_file": "/etc/dra-suite/nats/password",
        "settings": {"user": "agent", "password": "pw", "servers": ["nats://a:pw@h:1"]},
        "empty_password": "",
    }
    assert redact(event) == {
        "event": "nats_connecting",
        "token": REDACTED,
        "password_file": "/etc/dra-suite/nats/password",
        "settings": {"user": "agent", "password": REDACTED, "servers": ["nats://[REDACTED]@h:1"]},
        "empty_password": "",
    }
