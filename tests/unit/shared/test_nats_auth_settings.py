"""NATS credentials and TLS settings: flags and env twins, and a clear ConfigError for every
incomplete, conflicting or unusable combination, that never quotes a secret."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]  # ships no type hints
import pytest
import trustme

from devcluster.natsjwt import Operator, new_nkey
from services.allocation import cli as allocation_cli
from services.discovery import cli as discovery_cli
from services.dractl import cli as dractl_cli
from services.health import cli as health_cli
from shared import nats_auth
from shared.config import NATSSettings, add_arguments, env_name, from_args
from shared.errors import ConfigError

SECRET = "s3cret-value-that-must-not-leak"
NEW_FLAGS = {
    "--nats-password-file": "password_file",
    "--nats-token-file": "token_file",
    "--nats-nkey-seed-file": "nkey_seed_file",
    "--nats-creds-file": "creds_file",
    "--nats-tls-ca-file": "tls_ca_file",
    "--nats-tls-cert-file": "tls_cert_file",
    "--nats-tls-key-file": "tls_key_file",
}


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """Valid files of every kind the settings read."""
    ca = trustme.CA()
    client = ca.issue_cert("agent@dra-suite.io")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    client.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    return {
        "secret": _write(tmp_path / "secret", SECRET + "\n"),
        "seed": _write(tmp_path / "seed", new_nkey(nkeys.PREFIX_BYTE_USER).seed),
        "creds": _write(tmp_path / "agent.creds", Operator().user_creds("agent")),
        "ca": str(tmp_path / "ca.pem"),
        "cert": str(tmp_path / "cert.pem"),
        "key": str(tmp_path / "key.pem"),
        "dir": str(tmp_path),
    }


def _parse(argv: list[str], env: dict[str, str] | None = None) -> NATSSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser, NATSSettings)
    return from_args(NATSSettings, parser.parse_args(argv), env or {})


def _flag(field: str) -> str:
    (found,) = [f.metadata["flag"] for f in dataclasses.fields(NATSSettings) if f.name == field]
    return str(found)


@pytest.mark.parametrize("flag", NEW_FLAGS)
def test_every_new_flag_and_its_env_twin_fill_the_setting(flag, files):
    field = NEW_FLAGS[flag]
    values = {
        "password_file": files["secret"],
        "token_file": files["secret"],
        "nkey_seed_file": files["seed"],
        "creds_file": files["creds"],
        "tls_ca_file": files["ca"],
        "tls_cert_file": files["cert"],
        "tls_key_file": files["key"],
    }
    companions = {  # what the field needs beside it to be complete
        "password_file": {"user": "agent"},
        "tls_cert_file": {"tls_key_file": files["key"]},
        "tls_key_file": {"tls_cert_file": files["cert"]},
    }.get(field, {})
    given = {field: values[field], **companions}
    argv = [x for name, value in given.items() for x in (_flag(name), value)]
    env = {env_name(_flag(name)): value for name, value in given.items()}
    assert getattr(_parse(argv), field) == values[field]
    assert getattr(_parse([], env), field) == values[field]


@pytest.mark.parametrize(
    "parse",
    [
        lambda argv: allocation_cli.build_config(argv, {"NODE_NAME": "node-a"}).nats,
        lambda argv: discovery_cli.parse_config(argv, {"NODE_NAME": "node-a"}).nats,
        lambda argv: health_cli.parse(argv, {"NODE_NAME": "node-a"}).nats,
        lambda argv: from_args(
            NATSSettings, dractl_cli._parser().parse_args([*argv, "inventory"]), {}
        ),
    ],
    ids=["allocation", "discovery", "health", "dractl"],
)
def test_every_cli_takes_the_auth_and_tls_flags(parse, files):
    argv = ["--nats-user", "agent", "--nats-password-file", files["secret"]]
    argv += ["--nats-tls-ca-file", files["ca"]]
    argv += ["--nats-tls-cert-file", files["cert"], "--nats-tls-key-file", files["key"]]
    settings = parse(argv)
    assert (settings.user, settings.password_file) == ("agent", files["secret"])
    assert (settings.tls_ca_file, settings.tls_cert_file) == (files["ca"], files["cert"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"user": "agent", "password": SECRET, "token": SECRET}, "choose one way"),
        ({"token": SECRET, "nkey_seed_file": "{seed}"}, "choose one way"),
        ({"token": SECRET, "creds_file": "{creds}"}, "choose one way"),
        ({"nkey_seed_file": "{seed}", "creds_file": "{creds}"}, "choose one way"),
        ({"url": f"nats://agent:{SECRET}@h:4222", "token": SECRET}, "credentials in --nats-url"),
        ({"password": SECRET}, "needs --nats-user"),
        ({"user": "agent"}, "needs --nats-password-file"),
        ({"user": "agent", "password": SECRET, "password_file": "{secret}"}, "not both"),
        ({"token": SECRET, "token_file": "{secret}"}, "not both"),
        ({"tls_cert_file": "{cert}"}, "go together"),
        ({"tls_key_file": "{key}"}, "go together"),
        ({"token_file": "{dir}/missing"}, "cannot read: No such file"),
        ({"token_file": "{dir}"}, "cannot read: Is a directory"),
        ({"token_file": "{dir}/empty"}, "is empty"),
        ({"user": "agent", "password_file": "{dir}/missing"}, "nats password file"),
        ({"nkey_seed_file": "{secret}"}, "does not hold a valid nkey seed"),
        ({"nkey_seed_file": "{account_seed}"}, "not a user's"),
        ({"creds_file": "{secret}"}, "lacks the user JWT or the user nkey seed"),
        ({"tls_ca_file": "{secret}"}, "nats tls ca file"),
        ({"tls_ca_file": "{dir}/missing"}, "nats tls ca file"),
        ({"tls_cert_file": "{cert}", "tls_key_file": "{ca}"}, "client certificate"),
    ],
    ids=lambda v: v if isinstance(v, str) else ",".join(v),
)
def test_bad_combinations_and_files_are_config_errors_without_secrets(
    fields: dict[str, str], message: str, files, tmp_path
):
    (tmp_path / "empty").write_text("\n")
    account_seed = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT).seed
    values: dict[str, Any] = {
        k: v.format(**files, account_seed=_write(tmp_path / "acct", account_seed))
        for k, v in fields.items()
    }
    with pytest.raises(ConfigError, match=message) as raised:
        NATSSettings(**values)
    assert SECRET not in str(raised.value)
    assert account_seed not in str(raised.value)


def test_each_way_to_authenticate_alone_is_accepted(files):
    accepted: list[dict[str, Any]] = [
        {"user": "agent", "password": SECRET},
        {"user": "agent", "password_file": files["secret"]},
        {"token": SECRET},
        {"token_file": files["secret"]},
        {"nkey_seed_file": files["seed"]},
        {"creds_file": files["creds"]},
        {"url": f"nats://agent:{SECRET}@h:4222"},
        {"url": "tls://h:4222"},
        {"tls_ca_file": files["ca"], "tls_cert_file": files["cert"], "tls_key_file": files["key"]},
    ]
    for fields in accepted:
        NATSSettings(**fields)


def test_secrets_stay_out_of_the_settings_repr():
    settings = NATSSettings(user="agent", password=SECRET)
    assert SECRET not in repr(settings)
    assert SECRET not in repr(dataclasses.replace(settings, password="", token=SECRET, user=""))
    assert "agent" in repr(settings)


def test_connect_options_read_secret_files_at_every_connect(files, tmp_path):
    token_file = Path(_write(tmp_path / "token", "first\n"))
    options = nats_auth.connect_options(NATSSettings(token_file=str(token_file)))
    assert options["token"]() == "first"
    token_file.write_text("rotated\n")
    assert options["token"]() == "rotated"
    token_file.unlink()
    with pytest.raises(nats_auth.CredentialsUnreadableError, match="nats token file"):
        options["token"]()


def test_connect_options_build_tls_and_creds_callbacks(files):
    options = nats_auth.connect_options(
        NATSSettings(
            url="tls://h:4222",
            creds_file=files["creds"],
            tls_ca_file=files["ca"],
            tls_cert_file=files["cert"],
            tls_key_file=files["key"],
        )
    )
    assert options["tls"].verify_mode.name == "CERT_REQUIRED"
    assert options["user_jwt_cb"]().startswith(b"ey")
    assert options["signature_cb"]("nonce")
    assert not {"password", "token"} & options.keys()
