"""The auth service's config: seeds checked before any connection, flags and env twins."""

from __future__ import annotations

from pathlib import Path

import nkeys  # type: ignore[import-untyped]  # ships no type hints
import pytest

from services.natsauth import cli, keys
from shared.errors import ConfigError


def seed_file(tmp_path: Path, name: str, seed: str) -> str:
    path = tmp_path / name
    path.write_text(seed + "\n")
    return str(path)


def test_flags_and_env_twins_fill_the_config(tmp_path: Path):
    issuer = seed_file(tmp_path, "issuer", keys.new_signing_seed(nkeys.PREFIX_BYTE_ACCOUNT))
    xkey = seed_file(tmp_path, "xkey", keys.new_xkey_seed())
    env = {"ISSUER_SEED_FILE": issuer, "XKEY_SEED_FILE": xkey, "OPERATOR_USERS": "alice,bob"}
    config = cli.parse(["--driver-name", "a.example.com,b.example.com"], env)
    assert config.operator_users == ("alice", "bob")
    assert config.driver_name == ("a.example.com", "b.example.com")
    assert (config.audience, config.target_account) == ("nats.dra-suite.io", "DRA")
    assert config.xkey() is not None


BAD = {
    "no issuer seed": ([], "issuer-seed-file is required"),
    "a user seed as issuer": (["--issuer-seed-file", "USER"], "not an account seed"),
    "an account seed as xkey": (["--xkey-seed-file", "ACCOUNT"], "not a curve seed"),
    "a wildcard driver": (["--driver-name", "sim.*"], "not a DNS name"),
    "a bad account": (["--target-account", "D.R.A"], "not an account name"),
    "a negative answer budget": (["--refusals-answered-per-s", "-1"], "must not be negative"),
}


@pytest.mark.parametrize(("args", "message"), BAD.values(), ids=BAD)
def test_a_bad_config_is_refused_before_any_connection(
    args: list[str], message: str, tmp_path: Path
):
    files = {
        "USER": seed_file(tmp_path, "user", keys.new_signing_seed(nkeys.PREFIX_BYTE_USER)),
        "ACCOUNT": seed_file(tmp_path, "acct", keys.new_signing_seed(nkeys.PREFIX_BYTE_ACCOUNT)),
    }
    args = [files.get(arg, arg) for arg in args]
    if "--issuer-seed-file" not in args and message != "issuer-seed-file is required":
        args += ["--issuer-seed-file", files["ACCOUNT"]]
    with pytest.raises(ConfigError, match=message):
        cli.parse(args, {})


def test_keygen_prints_a_secret_whose_halves_match(capsys: pytest.CaptureFixture[str]):
    import yaml

    cli.main(["keygen", "--namespace", "ops"])
    secret = yaml.safe_load(capsys.readouterr().out)
    data = secret["stringData"]
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"]) == (
        "dra-suite-nats-callout",
        "ops",
    )
    issuer = keys.SigningKey.from_seed(data["issuer.seed"], nkeys.PREFIX_BYTE_ACCOUNT)
    assert issuer.public == data["issuer.pub"]
    assert keys.XKey.from_seed(data["xkey.seed"]).public == data["xkey.pub"]
    assert len(data["auth-password"]) >= 32


def test_keygen_passwords_parse_as_strings_in_a_nats_config():
    # nats-server parses a substituted $VAR as a config token: a leading digit makes it a
    # number and fails the config, and punctuation could read as syntax.
    import re

    from services.natsauth import secrets

    passwords = {secrets.password() for _ in range(2000)}
    assert len(passwords) == 2000
    assert all(re.fullmatch(r"[A-Za-z][A-Za-z0-9]{42}", p) for p in passwords)
