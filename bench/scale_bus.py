"""The bus under `make scale`'s fleet: open (no auth, no TLS) or secure, as a deployment runs it.

The secure bus is the production model on a 3-server cluster: every server demands TLS (the
handshake first) and hands every client but the auth service's own users to the auth callout;
`dra-nats-auth` runs as a process of its own against the fleet's API server, reviews each
agent's ServiceAccount token (TokenReview), admits it as its node's discovery, allocation or
health identity, provisions the buckets and the alert stream (R3) before any agent starts, and
certifies the agents' writer keys, so every record is signed and every reader checks it
(`--bus-signatures enforce`). Each node gets what the kubelet would give its three agent pods:
a pod per agent ServiceAccount bound to the node and a token for the bus's audience bound to
that pod. The harness and dractl connect as an operator (a ServiceAccount token the auth
service lists as an operator).

One difference from a cluster: every client connects from 127.0.0.1, so the auth service's
per-address TokenReview budget (`--reviews-per-source`, sized for one node's agents) is off.

`BusProfile` is what a worker needs to make each agent's settings; it travels as flags.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import nkeys  # type: ignore[import-untyped]  # ships no type hints
import trustme

from bench.scale_apiserver import FleetAPI
from devcluster.natsauth import AuthCallout, ServerAuth, ServerTLS
from devcluster.natscluster import free_port
from devcluster.processes import ChildProcess
from services.natsauth.keys import SigningKey, XKey, new_signing_seed, new_xkey_seed
from shared.config import NATSSettings
from shared.kube.client import KubeClient
from shared.kube.resources import PODS, ResourceType

__all__ = ["AGENT_ACCOUNTS", "SECURE_BUS", "BusProfile", "SecureBus"]

SECURE_BUS = "auth-callout+tls+signatures"
NAMESPACE = "dra-suite"
AUDIENCE = "nats.dra-suite.io"
AGENT_ACCOUNTS = {
    "discovery": "dra-discovery",
    "allocation": "dra-allocation",
    "health": "dra-health",
}
_OPERATOR = "dra-operator"
_TOKEN_LIFETIME_S = 6 * 3600
"""Longer than any run: a session ends at the earlier of its token's expiry and an hour."""
_IDENTITY_CONCURRENCY = 32
ACCOUNT_LIMITS = (
    "jetstream: { max_memory: 512MB, max_file: 4GB, max_streams: 16, max_consumers: 100000 }",
    "limits: { max_connections: 40000, max_subscriptions: 256, max_payload: 1MB }",
)
"""The app account's limits on a 3-server cluster: the streams reserve their max_bytes (1 GiB
together) on each of 3 servers, which the deployed 1280MB `max_file` refuses (the first
bucket, 512 MiB x 3, already does); room for 10,000 nodes (3 connections and 6 consumers
each, the harness aside)."""
_NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False)
_SERVICE_ACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class BusProfile:
    """How each agent of the fleet connects: the URLs, and on the secure bus its token file,
    the servers' CA and the signature settings."""

    url: str
    token_dir: Path | None = None
    """`<token_dir>/<role>/<node>` holds each agent's token; None: the open bus."""
    tls_ca_file: str = ""
    signatures: str = "off"
    auth_key_file: str = ""

    def settings(self, role: str, node: str) -> NATSSettings:
        token_file = str(self.token_dir / role / node) if self.token_dir is not None else ""
        return NATSSettings(
            url=self.url, replicas=3, request_timeout_s=10.0, token_file=token_file,
            tls_ca_file=self.tls_ca_file, bus_signatures=self.signatures,
            bus_auth_key_file=self.auth_key_file,
        )  # fmt: skip

    def as_flags(self) -> list[str]:
        flags = ["--nats-url", self.url, "--bus-signatures", self.signatures]
        if self.token_dir is not None:
            flags += ["--token-dir", str(self.token_dir)]
        if self.tls_ca_file:
            flags += ["--nats-tls-ca-file", self.tls_ca_file]
        if self.auth_key_file:
            flags += ["--bus-auth-key-file", self.auth_key_file]
        return flags

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--nats-url", required=True)
        parser.add_argument("--bus-signatures", default="off")
        parser.add_argument("--token-dir", type=Path, default=None)
        parser.add_argument("--nats-tls-ca-file", default="")
        parser.add_argument("--bus-auth-key-file", default="")

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> BusProfile:
        return cls(
            url=args.nats_url, token_dir=args.token_dir, tls_ca_file=args.nats_tls_ca_file,
            signatures=args.bus_signatures, auth_key_file=args.bus_auth_key_file,
        )  # fmt: skip


class SecureBus:
    """The callout's keys, the servers' TLS, the auth service and every node's tokens."""

    def __init__(self, workdir: Path, api: FleetAPI) -> None:
        self.dir = workdir / "bus"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.api = api
        self.auth_service: ChildProcess | None = None
        self.ops_port = 0
        self._issuer_seed = new_signing_seed(nkeys.PREFIX_BYTE_ACCOUNT)
        self._xkey_seed = new_xkey_seed()
        self._certify_seed = new_signing_seed(nkeys.PREFIX_BYTE_OPERATOR)
        self._password = secrets.token_urlsafe(16)
        self._sys_password = "s" + secrets.token_hex(16)
        self._tls = self._certificates()
        self.auth_key_file = self._write(
            "certify.pub",
            SigningKey.from_seed(self._certify_seed, nkeys.PREFIX_BYTE_OPERATOR).public,
        )
        self.operator_token_file = self.dir / "operator.token"

    @property
    def token_dir(self) -> Path:
        return self.dir / "tokens"

    def server_auth(self) -> ServerAuth:
        """What each nats-server of the cluster demands: TLS first, then the callout."""
        callout = AuthCallout(
            issuer=SigningKey.from_seed(self._issuer_seed, nkeys.PREFIX_BYTE_ACCOUNT).public,
            auth_password=self._password,
            sys_password=self._sys_password,
            xkey=XKey.from_seed(self._xkey_seed).public,
            account_limits=ACCOUNT_LIMITS,
        )
        return ServerAuth(callout=callout, tls=self._tls)

    def profile(self, url: str) -> BusProfile:
        return BusProfile(
            url=url, token_dir=self.token_dir, tls_ca_file=str(self._tls.ca_file),
            signatures="enforce", auth_key_file=self.auth_key_file,
        )  # fmt: skip

    def operator_settings(self, url: str) -> NATSSettings:
        return NATSSettings(
            url=url, replicas=3, request_timeout_s=10.0,
            token_file=str(self.operator_token_file), tls_ca_file=str(self._tls.ca_file),
            bus_signatures="enforce", bus_auth_key_file=self.auth_key_file,
        )  # fmt: skip

    def operator_flags(self) -> list[str]:
        """dractl's flags for the same identity and checks as `operator_settings`."""
        return [
            f"--nats-token-file={self.operator_token_file}",
            f"--nats-tls-ca-file={self._tls.ca_file}",
            "--bus-signatures=enforce",
            f"--bus-auth-key-file={self.auth_key_file}",
        ]

    async def start_auth_service(self, url: str) -> None:
        """`dra-nats-auth` as deployed (one replica), until it has provisioned the streams."""
        self.ops_port = ops_port = free_port()
        self.auth_service = ChildProcess(
            name="dra-nats-auth",
            argv=[
                sys.executable, "-m", "services.natsauth", "serve",
                f"--nats-url={url}", "--nats-user=dra-nats-auth",
                f"--nats-password-file={self._write('auth-password', self._password)}",
                f"--nats-tls-ca-file={self._tls.ca_file}", "--nats-replicas=3",
                "--nats-request-timeout-s=10",
                f"--kubeconfig={self.api.kubeconfig}", "--kube-request-timeout-s=30",
                f"--issuer-seed-file={self._write('issuer.seed', self._issuer_seed)}",
                f"--xkey-seed-file={self._write('xkey.seed', self._xkey_seed)}",
                f"--certify-seed-file={self._write('certify.seed', self._certify_seed)}",
                f"--sys-password-file={self._write('sys-password', self._sys_password)}",
                f"--operator-users=system:serviceaccount:{NAMESPACE}:{_OPERATOR}",
                "--reviews-per-source=0", "--driver-name=sim.dra-suite.io",
                "--log-level=warning", "--log-format=console",
                "--ops-host=127.0.0.1", f"--ops-port={ops_port}",
            ],
            log_path=self.dir / "dra-nats-auth.log",
            capture_stdout=False,
        )  # fmt: skip
        await self.auth_service.start()
        await _until_ready(self.auth_service, f"http://127.0.0.1:{ops_port}/readyz")

    async def stop(self) -> None:
        if self.auth_service is not None:
            await self.auth_service.stop(grace_s=10.0)

    async def create_identities(self, nodes: list[str]) -> None:
        """The agents' namespace and ServiceAccounts, the operator's token, and for every node
        a pod per agent ServiceAccount bound to it with a token for the bus bound to the pod."""
        kube = await KubeClient.connect(self.api.kube_settings())
        try:
            await kube.create(_NAMESPACES, _meta("Namespace", NAMESPACE))
            for account in (*AGENT_ACCOUNTS.values(), _OPERATOR):
                await kube.create(
                    _SERVICE_ACCOUNTS, _meta("ServiceAccount", account), namespace=NAMESPACE
                )
            for role in AGENT_ACCOUNTS:
                (self.token_dir / role).mkdir(parents=True, exist_ok=True)
            async with aiohttp.ClientSession() as session:
                minter = _TokenMinter(session, self.api)
                self._save(self.operator_token_file, await minter.token(_OPERATOR, pod=None))
                gate = asyncio.Semaphore(_IDENTITY_CONCURRENCY)

                async def node_identities(node: str) -> None:
                    async with gate:
                        for role, account in AGENT_ACCOUNTS.items():
                            pod = await kube.create(PODS, _pod(account, node), namespace=NAMESPACE)
                            token = await minter.token(account, pod=pod)
                            self._save(self.token_dir / role / node, token)

                await asyncio.gather(*(node_identities(node) for node in nodes))
        finally:
            await kube.close()

    async def authorized(self) -> int:
        """Connections the auth service has admitted so far (its decisions metric)."""
        url = f"http://127.0.0.1:{self.ops_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as answer:
            text = await answer.text()
        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines()
            if line.startswith("dra_nats_auth_decisions_total{") and '"allowed"' in line
        )

    def auth_pids(self) -> dict[str, int]:
        pid = self.auth_service.pid if self.auth_service is not None else None
        return {"auth": pid} if pid is not None else {}

    def _certificates(self) -> ServerTLS:
        ca = trustme.CA()
        served = ca.issue_cert("127.0.0.1", "localhost")
        paths = {name: self.dir / f"nats-{name}.pem" for name in ("ca", "cert", "key")}
        ca.cert_pem.write_to_path(str(paths["ca"]))
        served.cert_chain_pems[0].write_to_path(str(paths["cert"]))
        served.private_key_pem.write_to_path(str(paths["key"]))
        return ServerTLS(cert_file=paths["cert"], key_file=paths["key"], ca_file=paths["ca"])

    def _write(self, name: str, text: str) -> str:
        path = self.dir / name
        self._save(path, text)
        return str(path)

    @staticmethod
    def _save(path: Path, text: str) -> None:
        path.touch(mode=0o600)
        path.write_text(text + "\n")


class _TokenMinter:
    """TokenRequest over HTTPS as the harness (the cluster admin on the real API server)."""

    def __init__(self, session: aiohttp.ClientSession, api: FleetAPI) -> None:
        self._session = session
        self._api = api
        self._tls = api.client_tls()

    async def token(self, account: str, *, pod: dict[str, Any] | None) -> str:
        spec: dict[str, Any] = {"audiences": [AUDIENCE], "expirationSeconds": _TOKEN_LIFETIME_S}
        if pod is not None:
            meta = pod["metadata"]
            spec["boundObjectRef"] = {
                "kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"],
            }  # fmt: skip
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        path = _SERVICE_ACCOUNTS.path(namespace=NAMESPACE, name=account, subresource="token")
        async with self._session.post(f"{self._api.url}{path}", json=body, ssl=self._tls) as answer:
            reply = await answer.json()
            if answer.status != 201:
                raise RuntimeError(f"TokenRequest for {account}: HTTP {answer.status} {reply}")
        return str(reply["status"]["token"])


def _meta(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}


def _pod(account: str, node: str) -> dict[str, Any]:
    """An agent's pod as its DaemonSet would place it: on `node`, as `account`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{account}-{node}", "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "serviceAccountName": account,
            "automountServiceAccountToken": False,
            "containers": [{"name": "agent", "image": "dra-suite:scale"}],
        },
    }


async def _until_ready(child: ChildProcess, url: str, *, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s), aiohttp.ClientSession() as session:
        while True:
            if child.returncode is not None:
                raise RuntimeError(
                    f"{child.name} exited with {child.returncode}; see {child.log_path}"
                )
            try:
                async with session.get(url) as answer:
                    if answer.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
