"""The Bus against a real nats-server that demands credentials: user/password, token, nkey, JWT.

Each way to authenticate is tried with the right secret (KV and JetStream work), a wrong one
and none: a refused Bus logs a clear error without any secret and keeps trying, it never
crashes. Secrets come from flags or from files (a Kubernetes Secret mounted as files).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]  # ships no type hints
import pytest

from devcluster.natsauth import ServerAuth
from devcluster.natsjwt import Operator, new_nkey
from devcluster.natsserver import NATSServerProcess
from shared.config import NATSSettings
from tests.integration.security.secure_nats import eventually, exercise, logged, running_bus

pytestmark = pytest.mark.integration

SettingsFor = Callable[[NATSServerProcess], NATSSettings]


@dataclass(frozen=True)
class Case:
    auth: ServerAuth
    right: SettingsFor
    wrong: SettingsFor
    secrets: tuple[str, ...]
    """Every secret of the case, right and wrong: none may show up in a log event."""


def _settings(server: NATSServerProcess, **fields: Any) -> NATSSettings:
    return NATSSettings(url=server.url, namespace="sec", connect_timeout_s=1.0, **fields)


def _file(directory: Path, name: str, content: str) -> str:
    path = directory / name
    path.write_text(content + "\n")  # Secrets from files usually end in a newline
    path.chmod(0o600)
    return str(path)


def _case(kind: str, tmp: Path) -> Case:
    right, wrong = f"right-{secrets.token_hex(8)}", f"wrong-{secrets.token_hex(8)}"
    if kind == "password":
        return Case(
            ServerAuth(users={"agent": right}),
            lambda s: _settings(s, user="agent", password=right),
            lambda s: _settings(s, user="agent", password=wrong),
            (right, wrong),
        )
    if kind == "password-file":
        return Case(
            ServerAuth(users={"agent": right}),
            lambda s: _settings(s, user="agent", password_file=_file(tmp, "pw", right)),
            lambda s: _settings(s, user="agent", password_file=_file(tmp, "bad-pw", wrong)),
            (right, wrong),
        )
    if kind == "password-in-url":

        def in_url(server: NATSServerProcess, password: str) -> NATSSettings:
            url = server.url.replace("nats://", f"nats://agent:{password}@")
            return NATSSettings(url=url, namespace="sec", connect_timeout_s=1.0)

        return Case(
            ServerAuth(users={"agent": right}),
            lambda s: in_url(s, right),
            lambda s: in_url(s, wrong),
            (right, wrong),
        )
    if kind == "token":
        return Case(
            ServerAuth(token=right),
            lambda s: _settings(s, token=right),
            lambda s: _settings(s, token=wrong),
            (right, wrong),
        )
    if kind == "token-file":
        return Case(
            ServerAuth(token=right),
            lambda s: _settings(s, token_file=_file(tmp, "token", right)),
            lambda s: _settings(s, token_file=_file(tmp, "bad-token", wrong)),
            (right, wrong),
        )
    if kind == "nkey":
        user, stranger = new_nkey(nkeys.PREFIX_BYTE_USER), new_nkey(nkeys.PREFIX_BYTE_USER)
        return Case(
            ServerAuth(nkeys=(user.public,)),
            lambda s: _settings(s, nkey_seed_file=_file(tmp, "seed", user.seed)),
            lambda s: _settings(s, nkey_seed_file=_file(tmp, "bad-seed", stranger.seed)),
            (user.seed, stranger.seed),
        )
    assert kind == "creds"
    operator, foreign = Operator(), Operator("foreign")
    good, bad = operator.user_creds("agent"), foreign.user_creds("agent")
    return Case(
        ServerAuth(jwt=operator.trust),
        lambda s: _settings(s, creds_file=_file(tmp, "agent.creds", good)),
        lambda s: _settings(s, creds_file=_file(tmp, "bad.creds", bad)),
        tuple(_creds_seed(text) for text in (good, bad)),
    )


def _creds_seed(creds: str) -> str:
    lines = creds.splitlines()
    return lines[lines.index("-----BEGIN USER NKEY SEED-----") + 1]


KINDS = ["password", "password-file", "password-in-url", "token", "token-file", "nkey", "creds"]


@pytest.fixture(params=KINDS)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Case:
    return _case(request.param, tmp_path)


def _assert_no_secret(events: list[MutableMapping[str, Any]], case: Case) -> None:
    text = repr(events)
    leaked = [secret for secret in case.secrets if secret in text]
    assert not leaked, f"secrets in the log events: {events}"


async def test_the_right_credentials_give_kv_and_jetstream(case, secured_nats, bus_events):
    server = secured_nats(case.auth)
    async with running_bus(case.right(server)) as run:
        await eventually(run.bus.connected.is_set)
        await exercise(run.bus)
    _assert_no_secret(bus_events, case)


async def test_wrong_credentials_are_logged_without_the_secret_and_retried(
    case, secured_nats, bus_events
):
    server = secured_nats(case.auth)
    async with running_bus(case.wrong(server)) as run:
        [rejected, *_] = await eventually(lambda: logged(bus_events, "nats_auth_rejected"))
        assert "Authorization Violation" in rejected["error"]
        assert rejected["log_level"] == "error"
        assert rejected["auth"] in {"password", "url", "token", "nkey", "creds"}
        assert not run.task.done(), "a refused Bus must keep trying, not end"
        assert not run.bus.connected.is_set()
    _assert_no_secret(bus_events, case)


async def test_missing_credentials_are_refused_and_retried(case, secured_nats, bus_events):
    server = secured_nats(case.auth)
    async with running_bus(_settings(server)) as run:
        await eventually(lambda: logged(bus_events, "nats_auth_rejected"))
        assert not run.task.done()
        assert not run.bus.connected.is_set()


async def test_a_fixed_secret_file_lets_the_retrying_bus_in(tmp_path, secured_nats, bus_events):
    """The password file is read at every attempt: fixing the mounted Secret is enough."""
    right = secrets.token_hex(12)
    server = secured_nats(ServerAuth(users={"agent": right}))
    password_file = _file(tmp_path, "password", "stale-" + secrets.token_hex(4))
    async with running_bus(_settings(server, user="agent", password_file=password_file)) as run:
        await eventually(lambda: logged(bus_events, "nats_auth_rejected"))
        _file(tmp_path, "password", right)
        await eventually(run.bus.connected.is_set)
        await exercise(run.bus)
    assert right not in repr(bus_events)


async def test_the_connecting_line_names_the_server_without_its_userinfo(secured_nats, bus_events):
    password = secrets.token_hex(12)
    server = secured_nats(ServerAuth(users={"agent": password}))
    url = server.url.replace("nats://", f"nats://agent:{password}@")
    async with running_bus(NATSSettings(url=url, namespace="sec")) as run:
        await eventually(run.bus.connected.is_set)
    [connecting] = logged(bus_events, "nats_connecting")
    assert connecting["servers"] == f"nats://[REDACTED]@127.0.0.1:{server.port}"
    assert connecting["auth"] == "url"
    assert password not in repr(bus_events)


async def test_a_secret_file_gone_at_connect_time_is_retried_not_fatal(
    tmp_path, secured_nats, bus_events
):
    """The Secret volume can be briefly empty (an update in flight): wait for it, do not crash."""
    token = secrets.token_hex(12)
    server = secured_nats(ServerAuth(token=token))
    token_file = Path(_file(tmp_path, "token", token))
    settings = _settings(server, token_file=str(token_file))  # checked while the file exists
    os.remove(token_file)
    async with running_bus(settings) as run:
        [failed, *_] = await eventually(lambda: logged(bus_events, "nats_connect_failed"))
        assert "nats token file" in failed["error"]
        assert not run.task.done()
        _file(tmp_path, "token", token)
        await eventually(run.bus.connected.is_set)
        await exercise(run.bus)
    assert token not in repr(bus_events)
