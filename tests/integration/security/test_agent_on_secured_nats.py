"""A real agent process (`python -m services.allocation`) on an authenticated, TLS-only NATS,
and what its logs, errors and `--help` show when every kind of secret is set: none of them.

Secrets reach the agent as a Kubernetes Secret would give them: files named by env twins
(`NATS_PASSWORD_FILE`), or plain env/flags, or userinfo in the URL.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from devcluster.natsauth import ServerAuth, ServerTLS
from devcluster.natsserver import NATSServerProcess
from devcluster.processes import ChildProcess
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from shared.pb.drasuite.v1 import inventory_pb2
from tests.integration.security.secure_nats import PKI, eventually, running_bus

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
NAMESPACE = "secured"


def _env_without_nats() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}


def _allocation(
    base: Path,
    kube: KubeSettings,
    *,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> ChildProcess:
    argv = [
        sys.executable,
        "-m",
        "services.allocation",
        *("--node-name", NODE, "--driver-name", DRIVER, "--kubeconfig", kube.kubeconfig),
        *("--log-format", "json", "--log-level", "debug", "--nats-namespace", NAMESPACE),
        *("--plugin-registry-dir", str(base / "registry")),
        *("--plugin-data-dir", str(base / "plugins" / DRIVER), "--cdi-root", str(base / "cdi")),
        *args,
    ]
    return ChildProcess(
        name="allocation",
        argv=argv,
        log_path=base / "logs" / "allocation.log",
        env={**_env_without_nats(), **(env or {})},
    )


def _log(process: ChildProcess) -> str:
    path = process.log_path
    return path.read_text(errors="replace") if path.exists() else ""


async def _logged(process: ChildProcess, event: str) -> None:
    """Wait for a log line with `event`; an agent that starts slowly or dies shows its log."""
    try:
        await eventually(lambda: f'"event": "{event}"' in _log(process), timeout_s=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: no {event} in the log:\n{_log(process)}") from None


def _secret_file(base: Path, name: str, content: str) -> str:
    """As a Secret volume mounts it: one file per key, owner-only."""
    directory = base / "secrets"
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / name
    path.write_text(content + "\n")
    path.chmod(0o600)
    return str(path)


async def _publish_inventory(bus: Bus) -> None:
    inventory = inventory_pb2.Inventory(
        driver=DRIVER,
        node=NODE,
        pool=NODE,
        backend="sim",
        generation=1,
        devices=[inventory_pb2.Device(name="npu-0", kind="npu")],
    )
    key = bus.names.inventory_key(DRIVER, NODE)
    await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(inventory))


def _tls(pki: PKI, *, verify_clients: bool = False) -> ServerTLS:
    return ServerTLS(
        cert_file=pki.server_cert,
        key_file=pki.server_key,
        ca_file=pki.ca,
        verify_clients=verify_clients,
    )


async def test_allocation_agent_gets_its_inventory_over_password_auth_and_tls(
    pki, secured_nats, kube_settings, short_tmp
):
    password = secrets.token_hex(16)
    server = secured_nats(ServerAuth(users={"dra-allocation": password}, tls=_tls(pki)))
    env = {
        "NATS_URL": server.url,
        "NATS_USER": "dra-allocation",
        "NATS_PASSWORD_FILE": _secret_file(short_tmp, "password", password),
        "NATS_TLS_CA_FILE": str(pki.ca),
    }
    process = _allocation(short_tmp, kube_settings, env=env)
    client = NATSSettings(
        url=server.url,
        namespace=NAMESPACE,
        user="dra-allocation",
        password=password,
        tls_ca_file=str(pki.ca),
    )
    await process.start()
    try:
        async with running_bus(client) as run:
            await eventually(run.bus.connected.is_set)
            await _logged(process, "nats_connected")
            await _publish_inventory(run.bus)
            # The agent's KV watch saw it over its own authenticated connection.
            inventory_copy = short_tmp / "plugins" / DRIVER / "inventory.pb"
            await eventually(inventory_copy.exists, timeout_s=20)
    finally:
        assert await process.stop() == 0, _log(process)
    log = _log(process)
    assert password not in log
    assert "nats_auth_rejected" not in log


Setup = Callable[[NATSServerProcess, PKI, Path], tuple[list[str], dict[str, str]]]


def _flags_and_mutual_tls(password: str) -> Setup:
    def setup(server: NATSServerProcess, pki: PKI, base: Path) -> tuple[list[str], dict[str, str]]:
        args = ["--nats-url", server.url, "--nats-user", "agent", "--nats-password", password]
        args += ["--nats-tls-ca-file", str(pki.ca), "--nats-tls-cert-file", str(pki.client_cert)]
        args += ["--nats-tls-key-file", str(pki.client_key)]
        return args, {}

    return setup


def _token_env(token: str) -> Setup:
    def setup(server: NATSServerProcess, pki: PKI, base: Path) -> tuple[list[str], dict[str, str]]:
        return [], {"NATS_URL": server.url, "NATS_TOKEN": token, "NATS_TLS_CA_FILE": str(pki.ca)}

    return setup


def _userinfo_in_url(password: str) -> Setup:
    def setup(server: NATSServerProcess, pki: PKI, base: Path) -> tuple[list[str], dict[str, str]]:
        url = server.url.replace("tls://", f"tls://agent:{password}@")
        return [], {"NATS_URL": url, "NATS_TLS_CA_FILE": str(pki.ca)}

    return setup


RIGHT = "right-" + secrets.token_hex(12)
WRONG = "wrong-" + secrets.token_hex(12)
STARTUPS: dict[str, tuple[Callable[[PKI], ServerAuth], Setup, str]] = {
    # name -> (server auth, how the agent gets its secret, the event to wait for)
    "password flag and mutual TLS": (
        lambda pki: ServerAuth(users={"agent": RIGHT}, tls=_tls(pki, verify_clients=True)),
        _flags_and_mutual_tls(RIGHT),
        "nats_connected",
    ),
    "token env": (
        lambda pki: ServerAuth(token=RIGHT, tls=_tls(pki)),
        _token_env(RIGHT),
        "nats_connected",
    ),
    "userinfo in the url": (
        lambda pki: ServerAuth(users={"agent": RIGHT}, tls=_tls(pki)),
        _userinfo_in_url(RIGHT),
        "nats_connected",
    ),
    "a wrong token": (
        lambda pki: ServerAuth(token=RIGHT, tls=_tls(pki)),
        _token_env(WRONG),
        "nats_auth_rejected",
    ),
}


@pytest.mark.parametrize("startup", STARTUPS)
async def test_no_secret_in_the_agents_log(startup, pki, secured_nats, kube_settings, short_tmp):
    server_auth, setup, wait_for = STARTUPS[startup]
    server = secured_nats(server_auth(pki))
    args, env = setup(server, pki, short_tmp)
    process = _allocation(short_tmp, kube_settings, args=args, env=env)
    await process.start()
    try:
        await _logged(process, wait_for)
        # A little more of the agent's life: registration, watchers, retries.
        await asyncio.sleep(0.5)
    finally:
        code = await process.stop()
    log = _log(process)
    assert code == 0, log
    assert RIGHT not in log
    assert WRONG not in log
    if "url" in startup:
        assert "tls://[REDACTED]@127.0.0.1" in log


def test_a_conflicting_config_exits_2_and_names_flags_not_secrets(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "services.allocation", "--node-name", NODE],
        env={
            **_env_without_nats(),
            "NATS_USER": "agent",
            "NATS_PASSWORD": RIGHT,
            "NATS_TOKEN": WRONG,
            "PLUGIN_DATA_DIR": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "--nats-user/--nats-password and --nats-token" in result.stderr
    assert RIGHT not in result.stderr + result.stdout
    assert WRONG not in result.stderr + result.stdout


@pytest.mark.parametrize(
    "module",
    ["services.allocation", "services.discovery", "services.health", "services.dractl"],
)
def test_help_shows_no_secret_from_the_environment(module):
    env = {**_env_without_nats(), "NATS_PASSWORD": RIGHT, "NATS_TOKEN": WRONG}
    env["NATS_URL"] = f"nats://agent:{RIGHT}@nats:4222"
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--nats-token-file" in result.stdout
    assert RIGHT not in result.stdout + result.stderr
    assert WRONG not in result.stdout + result.stderr
