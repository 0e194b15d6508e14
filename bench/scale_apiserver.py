"""The API server under `make scale`'s fleet: the real one (etcd and kube-apiserver, built by
`make k8s`, through devcluster.controlplane) or the project's API emulator.

Both serve HTTPS with their CA in the kubeconfig the agents get. On the real one the agents and
the harness are the cluster admin (a client certificate in `system:masters`): simpler than a
ServiceAccount per agent, and it means the agents' requests pass API Priority and Fairness as
exempt, where a deployment's agents share the `workload-low` level.

Requests are counted the same way on both, by verb (get, list, watch, create, update, patch,
delete; `review` for the auth service's TokenReviews, which create nothing) over resource
requests only (/version, discovery, /metrics aside, and kube-apiserver's own identity lease,
renewed every 10 s): the emulator from its
request log, kube-apiserver from its `apiserver_request_total` counters (and, for watches, its
`apiserver_longrunning_requests` gauge: a watch is counted there while it is open).
"""

from __future__ import annotations

import abc
import re
import ssl
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import trustme

from devcluster.controlplane import (
    NEWEST,
    ControlPlaneNotBuiltError,
    RealControlPlane,
    cached_binaries,
    release,
)
from devcluster.processes import ChildProcess
from shared.config import KubeSettings

__all__ = ["EmulatorAPI", "FleetAPI", "RealAPI", "choose", "real_unavailable"]

_REQUEST_TIMEOUT_S = 30.0
_EMULATOR_VERSION = "1.36"
_EMULATOR_GATES = "DRADeviceTaints=true,DRADeviceTaintRules=true"
_VERBS = {"POST": "create", "PUT": "update", "APPLY": "patch"}
_REVIEWS = frozenset({"tokenreviews", "subjectaccessreviews"})
_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


class FleetAPI(abc.ABC):
    """An API server the fleet runs against; `start`, then `kube_settings` for clients."""

    kind: str
    """`real` or `emulator`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.url = ""
        self._mark: Counter[str] = Counter()

    @property
    @abc.abstractmethod
    def kubeconfig(self) -> Path: ...

    def kube_settings(self, *, request_timeout_s: float = _REQUEST_TIMEOUT_S) -> KubeSettings:
        return KubeSettings(kubeconfig=str(self.kubeconfig), request_timeout_s=request_timeout_s)

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @abc.abstractmethod
    def processes(self) -> dict[str, int]:
        """Figure name (`apiserver`, `etcd`, `emulator`) -> process ID, of those running."""

    @abc.abstractmethod
    def client_tls(self) -> ssl.SSLContext:
        """TLS as the harness connects: the server's CA, and the admin's certificate if any."""

    @abc.abstractmethod
    async def _counts(self) -> Counter[str]:
        """Requests by verb so far (watches: open now or seen so far, as the server counts)."""

    async def version(self) -> str:
        """`kube-apiserver v1.37.2` or `emulator (Kubernetes v1.36.0)`, from /version."""
        answer = await self._get("/version")
        return str(answer.get("gitVersion", "unknown"))

    async def mark(self) -> None:
        """Start counting requests from now (`since_mark`)."""
        self._mark = await self._counts()

    async def since_mark(self) -> Counter[str]:
        """Requests by verb since the last `mark`."""
        now = await self._counts()
        now.subtract(self._mark)
        return +now

    async def _get(self, path: str) -> Any:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}{path}", ssl=self.client_tls()) as answer,
        ):
            answer.raise_for_status()
            if answer.content_type == "application/json":
                return await answer.json()
            return await answer.text()


class RealAPI(FleetAPI):
    """etcd and kube-apiserver of the newest supported release, no scheduler or controllers."""

    kind = "real"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.plane = RealControlPlane(
            cached_binaries(release(NEWEST)), workdir / "control-plane", controllers=False
        )

    @property
    def kubeconfig(self) -> Path:
        return self.plane.admin_kubeconfig

    async def start(self) -> None:
        await self.plane.start()
        self.url = self.plane.url

    async def stop(self) -> None:
        await self.plane.stop()

    def processes(self) -> dict[str, int]:
        found = {name: self.plane.pid(component) for name, component in _COMPONENTS.items()}
        return {name: pid for name, pid in found.items() if pid is not None}

    def client_tls(self) -> ssl.SSLContext:
        return self.plane.admin_ssl_context()

    async def version(self) -> str:
        return f"kube-apiserver {await super().version()}"

    async def _counts(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for line in str(await self._get("/metrics")).splitlines():
            sample = _SAMPLE.match(line)
            if sample is None:
                continue
            labels = dict(_LABEL.findall(sample["labels"]))
            if labels.get("resource", "") in ("", "leases"):
                continue
            verb = labels.get("verb", "")
            if sample["name"] == "apiserver_request_total" and verb not in ("WATCH", "CONNECT"):
                verb = (
                    "review" if labels["resource"] in _REVIEWS else _VERBS.get(verb, verb.lower())
                )
                counts[verb] += int(float(sample["value"]))
            elif sample["name"] == "apiserver_longrunning_requests" and verb == "WATCH":
                counts["watch"] += int(float(sample["value"]))
        return counts


_COMPONENTS = {"apiserver": "kube-apiserver", "etcd": "etcd"}


class EmulatorAPI(FleetAPI):
    """`python -m devcluster.apiserver` in a process of its own, over HTTPS."""

    kind = "emulator"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.process: ChildProcess | None = None
        self.ca_file = workdir / "apiserver-ca.pem"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig.yaml"

    async def start(self) -> None:
        self.process = ChildProcess(
            name="apiserver",
            argv=[
                sys.executable,
                "-m",
                "devcluster.apiserver",
                *("--port", "0", "--kubeconfig", str(self.kubeconfig)),
                *("--kubernetes-version", _EMULATOR_VERSION),
                *("--feature-gates", _EMULATOR_GATES),
                *self._certificate(),
            ],
            log_path=self.workdir / "apiserver.log",
        )
        await self.process.start()
        line = await self.process.read_line_until("apiserver_ready", timeout_s=30)
        self.url = line.split("url=", 1)[-1].strip()

    def _certificate(self) -> list[str]:
        """The emulator serves HTTPS and the kubeconfig names its CA, as in a cluster.

        Over plain HTTP the Kubernetes client would load the system's whole CA bundle for each
        client it makes (28 ms, twice per simulated node), a cost no real node has: an agent
        makes one client and loads the cluster's one CA.
        """
        ca = trustme.CA()
        certificate = ca.issue_cert("127.0.0.1", "localhost")
        paths = {name: self.workdir / f"apiserver-{name}.pem" for name in ("cert", "key")}
        ca.cert_pem.write_to_path(str(self.ca_file))
        certificate.private_key_pem.write_to_path(str(paths["key"]))
        certificate.cert_chain_pems[0].write_to_path(str(paths["cert"]))
        return [
            *("--tls-cert-file", str(paths["cert"])),
            *("--tls-key-file", str(paths["key"])),
            *("--tls-ca-file", str(self.ca_file)),
        ]

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()

    def processes(self) -> dict[str, int]:
        pid = self.process.pid if self.process is not None else None
        return {"emulator": pid} if pid is not None else {}

    def client_tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    async def version(self) -> str:
        return f"emulator (Kubernetes {await super().version()})"

    async def mark(self) -> None:
        """The emulator's log is bounded (100,000 records): empty it instead of reading it."""
        async with (
            aiohttp.ClientSession() as session,
            session.delete(f"{self.url}/_emulator/requests", ssl=self.client_tls()) as answer,
        ):
            answer.raise_for_status()
        self._mark = Counter()

    async def _counts(self) -> Counter[str]:
        records = (await self._get("/_emulator/requests")).get("items", [])
        return Counter(
            "review" if r["resource"] in _REVIEWS else str(r["verb"])
            for r in records
            if r.get("resource")
        )


def real_unavailable() -> str | None:
    """Why the real control plane cannot run here (no Go, not built), or None."""
    try:
        cached_binaries(release(NEWEST))
    except ControlPlaneNotBuiltError as exc:
        return str(exc)
    return None


def choose(kind: str, workdir: Path) -> FleetAPI:
    """`real`, `emulator`, or `auto`: the real one when its binaries are cached."""
    if kind == "auto":
        kind = "emulator" if real_unavailable() else "real"
    if kind == "real":
        return RealAPI(workdir)
    if kind == "emulator":
        return EmulatorAPI(workdir)
    raise ValueError(f"unknown API server {kind!r}: real, emulator or auto")
