"""The simulated fleet of `make scale`: N nodes, each running the real discovery and health
agents (their `open` and `spawn`, every task they run on a node: scan, inventory publish, slice
reconcile, health evaluate/taint/alert, KV watchers) on the sim backend and monitor, and the
allocation agent's two KV watchers, against one NATS cluster and the API emulator, on the open
bus.

Many nodes share a worker process (`python -m bench.scale_fleet --first F --count C ...`, at
most `NODES_PER_WORKER` each: a node holds 5 sockets, and a process may open 20,000 files on
this machine). The processes around them (a 3-server NATS cluster, the API emulator) are
started here too, and the CPU each of them uses is read from /proc, so that the bottleneck can
be named.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import ssl
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme

from devcluster.natscluster import NATSCluster
from devcluster.processes import ChildProcess
from services.allocation.node_view import watchers
from services.allocation.node_view.health_board import HealthBoard
from services.allocation.node_view.inventory_cache import InventoryCache
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from services.health.agent import HealthAgent
from services.health.config import HealthConfig
from shared import logging
from shared.bus.connection import Bus
from shared.config import KubeSettings, LogSettings, NATSSettings, OpsSettings
from shared.kube import resources
from shared.kube.client import KubeClient
from shared.supervisor import eternal

__all__ = ["DRIVER", "NODES_PER_WORKER", "PROFILE", "Fleet", "NodeAgents", "cpu_s", "rss_mb"]

DRIVER = "sim.dra-suite.io"
PROFILE = Path(__file__).parents[1] / "shared" / "sim" / "profiles" / "ascend-910b.yaml"
"""8 NPUs per node."""
_START_CONCURRENCY = 200
"""Nodes opening their agents at a time, over all workers: more only queue for the CPU until
their API and NATS requests time out, and retry."""
NODES_PER_WORKER = 1250
_WORKER_READY = "worker_started"
_TICKS = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process (this one by default), in MiB."""
    status = Path(f"/proc/{pid or os.getpid()}/status").read_text()
    (line,) = [line for line in status.splitlines() if line.startswith("VmRSS:")]
    return int(line.split()[1]) / 1024


def cpu_s(pid: int | None = None) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid or os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def node_name(index: int) -> str:
    return f"sim-node-{index:05d}"


@dataclass
class Fleet:
    workdir: Path
    nodes: int
    nats: NATSCluster = field(init=False)
    apiserver: ChildProcess | None = None
    workers: list[ChildProcess] = field(default_factory=list)
    worker_base_rss_mb: float = 0.0
    """What the workers held before their first node (the interpreter and libraries)."""
    api_url: str = ""
    api_ca: Path = field(init=False)

    def __post_init__(self) -> None:
        self.nats = NATSCluster(self.workdir / "nats", size=3)

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig.yaml"

    @property
    def nats_settings(self) -> NATSSettings:
        return NATSSettings(url=self.nats.url, replicas=3, request_timeout_s=10.0)

    @property
    def kube_settings(self) -> KubeSettings:
        return KubeSettings(kubeconfig=str(self.kubeconfig), request_timeout_s=30.0)

    async def start_services(self) -> None:
        (self.workdir / "inventory").mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.nats.start)
        tls = self._api_certificate()
        self.apiserver = ChildProcess(
            name="apiserver",
            argv=[
                sys.executable,
                "-m",
                "devcluster.apiserver",
                *("--port", "0", "--kubeconfig", str(self.kubeconfig)),
                *("--kubernetes-version", "1.36"),
                *("--feature-gates", "DRADeviceTaints=true,DRADeviceTaintRules=true"),
                *tls,
            ],
            log_path=self.workdir / "apiserver.log",
        )
        await self.apiserver.start()
        line = await self.apiserver.read_line_until("apiserver_ready", timeout_s=30)
        self.api_url = line.split("url=", 1)[-1].strip()

    def _api_certificate(self) -> list[str]:
        """The emulator serves HTTPS and the kubeconfig names its CA, as in a cluster.

        Over plain HTTP the Kubernetes client would load the system's whole CA bundle for each
        client it makes (28 ms, twice per simulated node), a cost no real node has: an agent
        makes one client and loads the cluster's one CA.
        """
        ca = trustme.CA()
        self.api_ca = self.workdir / "apiserver-ca.pem"
        certificate = ca.issue_cert("127.0.0.1", "localhost")
        paths = {name: self.workdir / f"apiserver-{name}.pem" for name in ("ca", "cert", "key")}
        ca.cert_pem.write_to_path(str(paths["ca"]))
        certificate.private_key_pem.write_to_path(str(paths["key"]))
        certificate.cert_chain_pems[0].write_to_path(str(paths["cert"]))
        return [
            *("--tls-cert-file", str(paths["cert"])),
            *("--tls-key-file", str(paths["key"])),
            *("--tls-ca-file", str(paths["ca"])),
        ]

    def api_tls(self) -> ssl.SSLContext:
        """What a client of the emulator trusts: its CA."""
        return ssl.create_default_context(cafile=str(self.api_ca))

    async def register_nodes(self) -> None:
        """What each kubelet would have done: the Node objects exist before the agents."""
        gate = asyncio.Semaphore(_START_CONCURRENCY)
        kube = await KubeClient.connect(self.kube_settings)

        async def register(index: int) -> None:
            name = node_name(index)
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            }
            async with gate:
                await kube.create(resources.NODES, body)

        try:
            await asyncio.gather(*(register(i) for i in range(self.nodes)))
        finally:
            await kube.close()

    async def start_workers(self) -> None:
        """Start the workers, each opening its nodes' agents; return once all are started."""
        workers = math.ceil(self.nodes / NODES_PER_WORKER)
        for index in range(workers):
            first = index * self.nodes // workers
            count = (index + 1) * self.nodes // workers - first
            worker = ChildProcess(
                name=f"worker-{index}",
                argv=[
                    sys.executable,
                    "-m",
                    "bench.scale_fleet",
                    *("--first", str(first), "--count", str(count)),
                    *("--nats-url", self.nats.url, "--kubeconfig", str(self.kubeconfig)),
                    *("--workdir", str(self.workdir)),
                    *("--start-concurrency", str(max(1, _START_CONCURRENCY // workers))),
                ],
                log_path=self.workdir / f"worker-{index}.log",
            )
            await worker.start()
            self.workers.append(worker)
        for worker in self.workers:
            line = await worker.read_line_until(_WORKER_READY, timeout_s=600)
            self.worker_base_rss_mb += float(line.split("base_rss_mb=", 1)[1])

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.pid is not None]

    def varz(self) -> list[dict[str, Any]]:
        """Each server's /varz (messages, bytes, memory)."""
        found = []
        for port in self.nats.monitor_ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as answer:
                found.append(json.load(answer))
        return found

    def nats_pids(self) -> list[int]:
        return [s.pid for s in self.nats.servers if s.pid is not None]

    async def stop_services(self) -> None:
        for worker in self.workers:
            await worker.stop(grace_s=30.0)
        if self.apiserver is not None:
            await self.apiserver.stop()
        await asyncio.to_thread(self.nats.stop)


@dataclass
class NodeAgents:
    """The agents of nodes `first` .. `first + count - 1`, in this process."""

    nats: NATSSettings
    kube: KubeSettings
    workdir: Path
    first: int
    count: int
    start_concurrency: int = _START_CONCURRENCY
    agents: list[DiscoveryAgent | HealthAgent] = field(default_factory=list)

    def _agents_of(self, index: int) -> list[DiscoveryAgent | HealthAgent]:
        common: dict[str, Any] = {
            "nats": self.nats,
            "kube": self.kube,
            "ops": OpsSettings(ops_port=0),
            "node_name": node_name(index),
            "driver_name": DRIVER,
            "sim_profile": str(PROFILE),
        }
        return [
            DiscoveryAgent(DiscoveryConfig(**common)),
            HealthAgent(HealthConfig(**common, recovery_hold_s=1.0, flap_window_s=0.0)),
        ]

    async def run_agents(self, resources: contextlib.AsyncExitStack, tg: asyncio.TaskGroup) -> None:
        """Open every node's agents (a few at a time: each connects to NATS and the API) and
        spawn their tasks in `tg`."""
        gate = asyncio.Semaphore(self.start_concurrency)

        async def start(index: int) -> None:
            async with gate:
                for agent in self._agents_of(index):
                    await agent.open(resources)
                    agent.spawn(tg)
                    self.agents.append(agent)
                self._allocation_watchers(index, resources, tg)

        await asyncio.gather(*(start(i) for i in range(self.first, self.first + self.count)))

    def _allocation_watchers(
        self, index: int, resources: contextlib.AsyncExitStack, tg: asyncio.TaskGroup
    ) -> None:
        """The allocation agent's KV watchers (inventory, health) on its own connection, as
        the agent runs them; its kubelet front has no work at rest and is not simulated."""
        node = node_name(index)
        bus = Bus(self.nats, name=f"dra-allocation/{node}", component="allocation")
        resources.push_async_callback(bus.close)
        board = HealthBoard(pool=node)
        cache = InventoryCache(
            self.workdir / "inventory" / node, driver=DRIVER, node=node, backend="sim"
        )
        tasks = watchers.node_view_tasks(bus, cache=cache, board=board, driver=DRIVER, node=node)
        for name, coro in tasks.items():
            tg.create_task(eternal(name, coro), name=f"{name}/{node}")


async def _serve_nodes(nodes: NodeAgents) -> None:
    """Open the nodes' agents, say so on stdout, and run them until SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    base = rss_mb()
    try:
        async with contextlib.AsyncExitStack() as resources, asyncio.TaskGroup() as tg:
            tg.create_task(_stop_when_orphaned(stop))
            await nodes.run_agents(resources, tg)
            print(f"{_WORKER_READY} base_rss_mb={base:.1f}", flush=True)
            await stop.wait()
            raise _Stopped
    except* _Stopped:
        pass


async def _stop_when_orphaned(stop: asyncio.Event) -> None:
    """A worker whose `make scale` died (killed, Ctrl-C) stops instead of reconnecting forever."""
    parent = os.getppid()
    while os.getppid() == parent:  # noqa: ASYNC110 (no event tells a process its parent died)
        await asyncio.sleep(1.0)
    stop.set()


class _Stopped(Exception):
    """Ends the worker's TaskGroup (its tasks are eternal)."""


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.scale_fleet", description="one fleet worker")
    parser.add_argument("--first", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--start-concurrency", type=int, default=_START_CONCURRENCY)
    args = parser.parse_args()
    logging.configure(LogSettings(level="error", format="console"), service="scale-worker")
    nodes = NodeAgents(
        nats=NATSSettings(url=args.nats_url, replicas=3, request_timeout_s=10.0),
        kube=KubeSettings(kubeconfig=str(args.kubeconfig), request_timeout_s=30.0),
        workdir=args.workdir,
        first=args.first,
        count=args.count,
        start_concurrency=args.start_concurrency,
    )
    asyncio.run(_serve_nodes(nodes))


if __name__ == "__main__":
    main()
