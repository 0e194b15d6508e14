"""The secured bus as deployed: nats-server with auth callout, dra-nats-auth against the API
emulator, ServiceAccounts and pods on two nodes, and tokens minted by TokenRequest over HTTP.
dra-nats-auth certifies writer keys (`certify.seed`); the clients' settings sign and check
records as `signatures` says (`--bus-signatures`, off unless a test asks)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import nats
import nats.aio.client
import nats.errors
import nkeys  # type: ignore[import-untyped]  # ships no type hints

from devcluster.apiserver import APIServerEmulator
from devcluster.natsauth import AuthCallout, ServerAuth, ServerTLS
from devcluster.natsserver import NATSServerProcess
from services.natsauth.agent import AuthService
from services.natsauth.config import AuthServiceConfig
from services.natsauth.keys import SigningKey, XKey, new_signing_seed, new_xkey_seed
from services.natsauth.tokenreview import TokenReviewer
from shared.config import KubeSettings, NATSSettings
from shared.supervisor import run_agent
from tests.buses import connected

__all__ = [
    "AGENTS",
    "AUDIENCE",
    "DRIVER",
    "NAMESPACE",
    "NODES",
    "OPERATOR",
    "CalloutStack",
    "RawClient",
    "callout_stack",
    "connected",
    "eventually_async",
    "raw_client",
    "refused_connect",
]

T = TypeVar("T")
NAMESPACE = "dra-suite"
AUDIENCE = "nats.dra-suite.io"
DRIVER = "sim.dra-suite.io"
NODES = ("node-a", "node-b")
AGENTS = ("dra-discovery", "dra-allocation", "dra-health")
OPERATOR = "dra-operator"
ROLES = {"dra-discovery": "discovery", "dra-allocation": "allocation", "dra-health": "health"}


def pod_name(account: str, node: str) -> str:
    return f"{account}-{node}"


@dataclass
class CalloutStack:
    server: NATSServerProcess
    kube: APIServerEmulator
    directory: Path
    bus_namespace: str = ""
    signatures: str = "off"
    auth_key_file: str = ""
    service: AuthService | None = None
    config: AuthServiceConfig | None = None
    _files: list[Path] = field(default_factory=list)

    async def token(
        self,
        account: str,
        *,
        node: str = "",
        audience: str = AUDIENCE,
        expiration_s: int = 3600,
        namespace: str = NAMESPACE,
    ) -> str:
        """A projected-style token from TokenRequest, bound to the account's pod on `node`."""
        spec: dict[str, object] = {"audiences": [audience], "expirationSeconds": expiration_s}
        if node:
            name = pod_name(account, node)
            pod = self.kube.get_object("pods", name, namespace)
            assert pod is not None
            spec["boundObjectRef"] = {
                "kind": "Pod", "apiVersion": "v1", "name": name, "uid": pod["metadata"]["uid"],
            }  # fmt: skip
        url = f"{self.kube.url}/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        # One request, one connection, closed with its answer: no keep-alive socket is left
        # for the session's close to race with.
        connector = aiohttp.TCPConnector(force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(url, json=body) as answer,
        ):
            reply = await answer.json()
            assert answer.status == 201, reply
        return str(reply["status"]["token"])

    def token_file(self, token: str) -> Path:
        path = self.directory / f"token-{len(self._files)}"
        path.write_text(token + "\n")
        self._files.append(path)
        return path

    @staticmethod
    def rotate(token_file: str, token: str) -> None:
        """Replace the token as the kubelet does: a new file renamed over the old one."""
        path = Path(token_file)
        staged = path.with_suffix(".new")
        staged.write_text(token + "\n")
        staged.replace(path)

    def settings(self, token: str | None) -> NATSSettings:
        token_file = str(self.token_file(token)) if token is not None else ""
        tls = self.server.auth.tls if self.server.auth is not None else None
        signed = self.signatures != "off"
        return NATSSettings(
            url=self.server.url, namespace=self.bus_namespace, token_file=token_file,
            connect_timeout_s=2.0, request_timeout_s=2.0,
            tls_ca_file=str(tls.ca_file) if tls is not None and tls.ca_file else "",
            bus_signatures=self.signatures, bus_auth_key_file=self.auth_key_file if signed else "",
        )  # fmt: skip

    async def agent_settings(self, account: str, node: str) -> NATSSettings:
        return self.settings(await self.token(account, node=node))


def _write(path: Path, text: str) -> str:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


def _populate(kube: APIServerEmulator, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    kube.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for account in (*AGENTS, OPERATOR, "default"):
        kube.create_object({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": NAMESPACE},
        })  # fmt: skip
    for node in NODES:
        kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        for account in (*AGENTS, "default"):
            kube.create_object({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name(account, node), "namespace": NAMESPACE},
                "spec": {"nodeName": node, "serviceAccountName": account,
                         "containers": [{"name": "agent", "image": "dra-suite:test"}]},
            })  # fmt: skip


@contextlib.asynccontextmanager
async def callout_stack(
    kube: APIServerEmulator,
    directory: Path,
    *,
    bus_namespace: str = "",
    xkey: bool = True,
    store_dir: Path | None = None,
    in_process: bool = True,
    tls: ServerTLS | None = None,
    reviewer: TokenReviewer | None = None,
    signatures: str = "off",
) -> AsyncIterator[CalloutStack]:
    """nats-server (auth callout, config-mode accounts) and dra-nats-auth, both running
    (without `in_process`, the test runs the service itself from `stack.config`)."""
    _populate(kube, directory)
    issuer_seed = new_signing_seed(nkeys.PREFIX_BYTE_ACCOUNT)
    xkey_seed = new_xkey_seed()
    certify_seed = new_signing_seed(nkeys.PREFIX_BYTE_OPERATOR)
    certify_pub = SigningKey.from_seed(certify_seed, nkeys.PREFIX_BYTE_OPERATOR).public
    password = secrets.token_urlsafe(16)
    sys_password = secrets.token_hex(16)
    callout = AuthCallout(
        issuer=SigningKey.from_seed(issuer_seed, nkeys.PREFIX_BYTE_ACCOUNT).public,
        auth_password=password,
        sys_password="s" + sys_password,
        xkey=XKey.from_seed(xkey_seed).public if xkey else "",
    )
    server = NATSServerProcess(
        store_dir or directory / "nats", auth=ServerAuth(callout=callout, tls=tls)
    )
    server.start()
    stack = CalloutStack(server=server, kube=kube, directory=directory,
                         bus_namespace=bus_namespace, signatures=signatures,
                         auth_key_file=_write(directory / "certify.pub", certify_pub))  # fmt: skip
    config = AuthServiceConfig(
        nats=NATSSettings(
            url=server.url, namespace=bus_namespace, user="dra-nats-auth",
            password_file=_write(directory / "auth-password", password),
            tls_ca_file=str(tls.ca_file) if tls is not None and tls.ca_file else "",
        ),
        kube=KubeSettings(
            kubeconfig=str(kube.write_kubeconfig(directory / "kubeconfig")), request_timeout_s=5
        ),
        issuer_seed_file=_write(directory / "issuer.seed", issuer_seed),
        xkey_seed_file=_write(directory / "xkey.seed", xkey_seed) if xkey else "",
        sys_password_file=_write(directory / "sys-password", "s" + sys_password),
        certify_seed_file=_write(directory / "certify.seed", certify_seed),
        revocation_poll_s=0.5,
        operator_users=(f"system:serviceaccount:{NAMESPACE}:{OPERATOR}",),
        driver_name=(DRIVER,),
    )  # fmt: skip
    stack.config = config
    if not in_process:
        try:
            yield stack
        finally:
            server.stop()
        return
    service = AuthService(config, reviewer=reviewer)
    stack.service = service
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(service, grace_s=5, stop=stop, handle_signals=False))
    try:
        await asyncio.wait_for(service.subscribed.wait(), 10)
        await asyncio.wait_for(service.provisioner.done.wait(), 10)  # before any agent, as live
        if service.certifier is not None:
            await asyncio.wait_for(service.certifier.serving.wait(), 10)
        yield stack
    finally:
        stop.set()
        try:
            code = await asyncio.wait_for(task, 10)
        finally:
            server.stop()  # also when the service hangs or fails: no server outlives the test
        assert code == 0


@dataclass
class RawClient:
    """An attacker's plain nats-py connection, and every error the server sent it."""

    nc: nats.aio.client.Client
    errors: list[str]

    async def violation(self, action: str, subject: str, *, timeout_s: float = 5.0) -> str:
        """Wait for the server's permission violation for `action` (publish/subscription)."""
        wanted = f'permissions violation for {action} to "{subject}"'.lower()

        def seen() -> str | None:
            return next((e for e in self.errors if wanted in e.lower()), None)

        deadline = asyncio.get_running_loop().time() + timeout_s
        while (found := seen()) is None:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no {wanted!r}; the server said {self.errors}")
            await asyncio.sleep(0.02)
        return found


@contextlib.asynccontextmanager
async def raw_client(stack: CalloutStack, token: str, *, inbox: str) -> AsyncIterator[RawClient]:
    errors: list[str] = []

    async def collect(exc: Exception) -> None:
        errors.append(str(exc).lower())

    nc = await nats.connect(
        stack.server.url, token=token, inbox_prefix=inbox, error_cb=collect,
        allow_reconnect=False, connect_timeout=2,
    )  # fmt: skip
    try:
        yield RawClient(nc, errors)
    finally:
        await nc.close()


async def refused_connect(stack: CalloutStack, token: str | None) -> str:
    """Connect once with `token` (or none); the server's refusal, as nats-py reports it."""
    errors: list[str] = []

    async def collect(exc: Exception) -> None:
        errors.append(str(exc).lower())

    options: dict[str, Any] = {"token": token} if token is not None else {}
    nc = nats.aio.client.Client()
    try:
        await nc.connect(
            stack.server.url, error_cb=collect, allow_reconnect=False, connect_timeout=2,
            max_reconnect_attempts=0, **options,
        )  # fmt: skip
    except (nats.errors.Error, OSError) as exc:
        return " ".join([str(exc).lower(), *errors])
    finally:
        await nc.close()  # also releases the socket of a refused attempt
    raise AssertionError("the server admitted the client")


async def eventually_async(
    make: Callable[[], Awaitable[T | None]], *, timeout_s: float = 20.0
) -> T:
    """The first truthy result of `make()`; an exception counts as not yet (dractl raises
    until what it reads exists)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            result = await make()
        except Exception:  # not there yet
            result = None
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"nothing within {timeout_s}s")
        await asyncio.sleep(0.2)
