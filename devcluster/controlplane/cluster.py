"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager as child processes, built from the project's Go modules.

There is no kubelet: Nodes are objects the harness registers (`register_node`), with the
node-lifecycle controller off so nobody taints them unreachable. Authentication is by client
certificates from a fresh CA (the admin is in `system:masters`, the scheduler and the
controller-manager are their own users under RBAC), and ServiceAccount tokens are RS256 from
a key made for this start, with OIDC discovery and JWKS served by kube-apiserver itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from devcluster.apiserver import kubeconfig as kubeconfig_files
from devcluster.controlplane.build import ControlPlaneBinaries
from devcluster.controlplane.pki import (
    ADMIN,
    CONTROLLER_MANAGER,
    SCHEDULER,
    ClientIdentity,
    ControlPlanePKI,
    write_pki,
)
from devcluster.processes import ChildProcess
from shared.config import KubeSettings

__all__ = ["ControlPlaneStartError", "RealControlPlane"]

SERVICE_CIDR = "10.0.0.0/24"
_CONTROLLERS = ",".join(
    ["*", "device-taint-eviction-controller", "-node-lifecycle-controller", "-node-ipam-controller"]
)
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  userGroups: ["system:serviceaccounts:kube-system"]
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
"""
"""Every request of a workload's ServiceAccount (an agent's token), at Metadata level: who,
verb, resource, the authorizer's decision and the response code. The controller-manager's
accounts (kube-system), the scheduler and the admin are left out: they are most of the traffic."""


class ControlPlaneStartError(RuntimeError):
    """A component exited or did not turn healthy in time; the message names its log."""


class RealControlPlane:
    """Start with `async with RealControlPlane(binaries, workdir) as plane:`."""

    def __init__(
        self, binaries: ControlPlaneBinaries, workdir: Path, *, controllers: bool = True
    ) -> None:
        """Without `controllers`, only etcd and kube-apiserver run: what serves API clients
        (`make scale`), with no scheduler placing pods and no controller reconciling objects."""
        self.binaries = binaries
        self.workdir = workdir
        self.controllers = controllers
        self.release = binaries.release
        self.pki: ControlPlanePKI | None = None
        self.apiserver_port = 0
        self.started_in_s = 0.0
        """Seconds from the first process started to every component healthy."""
        self._children: list[ChildProcess] = []

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def issuer(self) -> str:
        """The ServiceAccount issuer: kube-apiserver's own URL, so its OIDC discovery is real."""
        return self.url

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log: one JSON event a line (`AUDIT_POLICY` says which)."""
        return self.workdir / "logs" / "audit.log"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    def kube_settings(self, *, request_timeout_s: float = 10.0) -> KubeSettings:
        """KubeSettings as the cluster admin."""
        return KubeSettings(
            kubeconfig=str(self.admin_kubeconfig), request_timeout_s=request_timeout_s
        )

    def write_token_kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig that authenticates with a bearer token (a ServiceAccount's)."""
        assert self.pki is not None
        return kubeconfig_files.write(path, self.url, token=token, ca_file=str(self.pki.ca_cert))

    async def __aenter__(self) -> RealControlPlane:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self, *, timeout_s: float = 120.0) -> None:
        began = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = await asyncio.to_thread(write_pki, self.workdir / "pki")
        try:
            async with asyncio.timeout(timeout_s):
                etcd_url = await self._start_etcd()
                await self._start_apiserver(etcd_url)
                if self.controllers:
                    await asyncio.gather(self._start_scheduler(), self._start_controller_manager())
        except BaseException as exc:
            await self.stop()
            if isinstance(exc, TimeoutError):
                raise ControlPlaneStartError(
                    f"the control plane was not healthy within {timeout_s:.0f} s; "
                    f"logs in {self.workdir / 'logs'}"
                ) from exc
            raise
        self.started_in_s = time.monotonic() - began

    async def stop(self) -> None:
        """Stop in reverse order: controllers first, etcd last."""
        while self._children:
            await self._children.pop().stop(grace_s=10.0)

    def pid(self, component: str) -> int | None:
        """The process ID of a running component ("etcd", "kube-apiserver", ...), else None."""
        child = next((c for c in self._children if c.name == component), None)
        return child.pid if child is not None and child.returncode is None else None

    def log_path(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"

    async def _start_etcd(self) -> str:
        client, peer = _free_port(), _free_port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        await self._spawn(
            "etcd",
            [
                "--name=control-plane",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=control-plane={peer_url}",
                "--log-level=warn",
                # A test cluster's data lives as long as the test: no fsync, as kind does.
                "--unsafe-no-fsync",
            ],
        )
        await self._until_healthy("etcd", f"{client_url}/health", None)
        return client_url

    async def _start_apiserver(self, etcd_url: str) -> None:
        pki = self._pki()
        self.apiserver_port = _free_port()
        args = [
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            # Read by the scheduler's and controller-manager's delegated authentication.
            f"--requestheader-client-ca-file={pki.ca_cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={self.issuer}",
            f"--service-account-key-file={pki.service_account_public_key}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            # No pod network: nothing reaches kube-apiserver through the `kubernetes` Service, and
            # its endpoints could only name a loopback address, which the reconciler refuses.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--audit-policy-file={self._audit_policy()}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",  # the default: no batching, so no event waits in a buffer
        ]
        args += self._gate_args()
        if self.release.runtime_config:
            args.append(f"--runtime-config={','.join(self.release.runtime_config)}")
        await self._spawn("kube-apiserver", args)
        await self._until_healthy("kube-apiserver", f"{self.url}/readyz", self.admin_ssl_context())
        kubeconfig_files.write(self.admin_kubeconfig, self.url, ca_file=str(pki.ca_cert))
        self._add_client_cert(self.admin_kubeconfig, ADMIN)

    async def _start_scheduler(self) -> None:
        port = _free_port()
        config = self._component_kubeconfig(SCHEDULER)
        await self._spawn(
            "kube-scheduler",
            [
                "--v=2",
                f"--kubeconfig={config}",
                f"--authentication-kubeconfig={config}",
                f"--authorization-kubeconfig={config}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
                *self._gate_args(),
            ],
        )
        await self._until_healthy(
            "kube-scheduler", f"https://127.0.0.1:{port}/healthz", _no_verify()
        )

    async def _start_controller_manager(self) -> None:
        pki = self._pki()
        port = _free_port()
        config = self._component_kubeconfig(CONTROLLER_MANAGER)
        await self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={config}",
                f"--authentication-kubeconfig={config}",
                f"--authorization-kubeconfig={config}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'controller-manager-certs'}",
                f"--controllers={_CONTROLLERS}",
                # Each controller acts as its own ServiceAccount under RBAC, as kubeadm sets it.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.service_account_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                *self._gate_args(),
            ],
        )
        url = f"https://127.0.0.1:{port}/healthz"
        await self._until_healthy("kube-controller-manager", url, _no_verify())

    def _audit_policy(self) -> Path:
        path = self.workdir / "audit-policy.yaml"
        path.write_text(AUDIT_POLICY)
        return path

    def _gate_args(self) -> list[str]:
        gates = self.release.gates_flag()
        return [f"--feature-gates={gates}"] if gates else []

    def _pki(self) -> ControlPlanePKI:
        assert self.pki is not None, "start() writes the PKI first"
        return self.pki

    def _component_kubeconfig(self, client: ClientIdentity) -> Path:
        path = self.workdir / f"{client.name}.kubeconfig"
        kubeconfig_files.write(path, self.url, ca_file=str(self._pki().ca_cert))
        self._add_client_cert(path, client)
        return path

    def _add_client_cert(self, path: Path, client: ClientIdentity) -> None:
        import yaml

        pki = self._pki()
        document: dict[str, Any] = yaml.safe_load(path.read_text())
        document["users"][0]["user"] = {
            "client-certificate": str(pki.client_cert(client)),
            "client-key": str(pki.client_key(client)),
        }
        path.write_text(yaml.safe_dump(document, sort_keys=False))

    def admin_ssl_context(self) -> ssl.SSLContext:
        """TLS as the cluster admin: the cluster's CA and the admin's client certificate."""
        pki = self._pki()
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        context.load_cert_chain(pki.client_cert(ADMIN), pki.client_key(ADMIN))
        return context

    async def _spawn(self, component: str, args: list[str]) -> ChildProcess:
        child = ChildProcess(
            component,
            [str(self.binaries.path(component)), *args],
            self.log_path(component),
            env={**os.environ},
            capture_stdout=False,
        )
        await child.start()
        self._children.append(child)
        return child

    async def _until_healthy(
        self, component: str, url: str, context: ssl.SSLContext | None
    ) -> None:
        """Poll `url` until it answers 200; ControlPlaneStartError if the process exits."""
        child = next(c for c in self._children if c.name == component)
        async with aiohttp.ClientSession() as session:
            while True:
                if child.returncode is not None:
                    raise ControlPlaneStartError(
                        f"{component} exited with {child.returncode}; see {child.log_path}"
                    )
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(url, ssl=context or False) as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.1)


def _no_verify() -> ssl.SSLContext:
    """The scheduler and controller-manager serve /healthz on a self-signed certificate."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
