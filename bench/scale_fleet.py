"""The simulated fleet of `make scale`: N nodes, each running the real agents (their `open` and
`spawn`, every task they run on a node) on the sim backend and monitor: discovery (scan,
inventory publish, slice reconcile), health (evaluate, taints, alerts) and allocation (its DRA
and registration gRPC servers on per-node sockets, its node-view watchers, its prepared-claims
records), against one NATS cluster (`bench.scale_bus`: open or secure) and one API server
(`bench.scale_apiserver`: real or the emulator).

Many nodes share a worker process (`python -m bench.scale_fleet --first F --count C ...`, at
most `NODES_PER_WORKER` each: a node holds about 8 sockets, and a process may open 20,000
files on this machine). The processes around them are started here too, and the CPU each of
them uses is read from /proc, so that the bottleneck can be named.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.sslproto
import contextlib
import json
import math
import os
import signal
import sys
import urllib.request
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.scale_apiserver import FleetAPI
from bench.scale_bus import BusProfile, SecureBus
from bench.scale_tasks import dump_tasks
from devcluster.natscluster import NATSCluster
from devcluster.processes import ChildProcess
from services.allocation.config import AllocationConfig
from services.allocation.dra.agent import AllocationAgent
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from services.health.agent import HealthAgent
from services.health.config import HealthConfig
from shared import logging
from shared.config import KubeSettings, LogSettings, NATSSettings, OpsSettings
from shared.kube import resources
from shared.kube.client import KubeClient

__all__ = [
    "AGENT_SETS",
    "DRIVER",
    "NODES_PER_WORKER",
    "PROFILE",
    "Fleet",
    "NodeAgents",
    "cpu_s",
    "node_dir",
    "node_name",
    "rss_mb",
]

DRIVER = "sim.dra-suite.io"
PROFILE = Path(__file__).parents[1] / "shared" / "sim" / "profiles" / "ascend-910b.yaml"
"""8 NPUs per node."""
_START_CONCURRENCY = 200
"""Nodes opening their agents at a time, over all workers: more only queue for the CPU until
their API and NATS requests time out, and retry."""
NODES_PER_WORKER = 1000
_TLS_READ_BUFFER = 32 * 1024
_CONNECT_WAIT_S = 60.0
"""The longest a node holds the start gate waiting for its agents' first connects."""
AGENT_SETS = {
    "all": ("discovery", "health", "allocation"),
    "discovery+health": ("discovery", "health"),
}
"""Which agents each node runs: all three as deployed, or the two that publish (a fleet too
large for this machine's memory with the allocation agents)."""
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


def node_dir(workdir: Path, node: str) -> Path:
    """A node's own directory: the allocation agent's sockets, checkpoint, CDI specs."""
    return workdir / "nodes" / node


@dataclass
class Fleet:
    workdir: Path
    nodes: int
    api: FleetAPI
    secure: bool
    agents: str = "all"
    """A key of `AGENT_SETS`."""
    nats: NATSCluster = field(init=False)
    bus: SecureBus | None = None
    workers: list[ChildProcess] = field(default_factory=list)
    worker_base_rss_mb: float = 0.0
    """What the workers held before their first node (the interpreter and libraries)."""
    worker_base_cpu_s: float = 0.0
    """What the workers spent before their first node (starting, importing)."""

    def __post_init__(self) -> None:
        if self.secure:
            self.bus = SecureBus(self.workdir, self.api)
        auth = self.bus.server_auth() if self.bus is not None else None
        self.nats = NATSCluster(self.workdir / "nats", size=3, auth=auth, keep_logs=True)

    @property
    def profile(self) -> BusProfile:
        if self.bus is not None:
            return self.bus.profile(self.nats.url)
        return BusProfile(url=self.nats.url)

    @property
    def nats_settings(self) -> NATSSettings:
        """The harness's own connection: an operator on the secure bus."""
        if self.bus is not None:
            return self.bus.operator_settings(self.nats.url)
        return NATSSettings(url=self.nats.url, replicas=3, request_timeout_s=10.0)

    @property
    def kube_settings(self) -> KubeSettings:
        return self.api.kube_settings()

    async def start_services(self) -> None:
        """The API server and the NATS cluster; the Node objects; on the secure bus every
        node's identities and then the auth service (which provisions the streams)."""
        await self.api.start()
        await asyncio.to_thread(self.nats.start)
        await self.register_nodes()
        if self.bus is not None:
            await self.bus.create_identities([node_name(i) for i in range(self.nodes)])
            await self.bus.start_auth_service(self.nats.url)

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

    async def start_workers(self, *, timeout_s: float) -> None:
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
                    *self.profile.as_flags(),
                    *("--kubeconfig", str(self.api.kubeconfig)),
                    *("--workdir", str(self.workdir)),
                    *("--start-concurrency", str(max(1, _START_CONCURRENCY // workers))),
                    *("--agents", self.agents),
                ],
                log_path=self.workdir / f"worker-{index}.log",
            )
            await worker.start()
            self.workers.append(worker)
        for worker in self.workers:
            line = await worker.read_line_until(_WORKER_READY, timeout_s=timeout_s)
            found = dict(part.split("=", 1) for part in line.split()[1:])
            self.worker_base_rss_mb += float(found["base_rss_mb"])
            self.worker_base_cpu_s += float(found["base_cpu_s"])

    async def dump_worker_tasks(self) -> None:
        """Have each worker write what its tasks wait on to its log (`bench.scale_tasks`)."""
        for pid in self.worker_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        await asyncio.sleep(2.0)

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.pid is not None]

    def service_pids(self) -> dict[str, list[int]]:
        """The shared processes by figure name: `apiserver`, `etcd` (or `emulator`), `nats`,
        `auth` (secure bus)."""
        found = {name: [pid] for name, pid in self.api.processes().items()}
        found["nats"] = [s.pid for s in self.nats.servers if s.pid is not None]
        if self.bus is not None:
            found |= {name: [pid] for name, pid in self.bus.auth_pids().items()}
        return found

    def varz(self) -> list[dict[str, Any]]:
        """Each server's /varz (messages, bytes, memory)."""
        found = []
        for port in self.nats.monitor_ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as answer:
                found.append(json.load(answer))
        return found

    def client_msgs(self, nodes: Collection[str] | None = None) -> Counter[str]:
        """Messages the agents' connections published so far, summed over the servers, by
        agent (connection names `dra-<agent>/<node>` or `dra-<agent>-<node>`); only those of
        `nodes` if given."""
        total: Counter[str] = Counter()
        for port in self.nats.monitor_ports:
            url = f"http://127.0.0.1:{port}/connz?limit=100000"
            with urllib.request.urlopen(url, timeout=10) as answer:
                connections = json.load(answer)["connections"] or []
            for connection in connections:
                name = connection.get("name", "")
                if nodes is not None and not any(name.endswith(n) for n in nodes):
                    continue
                if name.startswith("dra-") and not name.startswith("dra-nats-auth"):
                    agent = name.removeprefix("dra-").split("/")[0].split("-")[0]
                    total[agent] += connection["in_msgs"]
        return total

    async def stop_services(self) -> None:
        for worker in self.workers:
            await worker.stop(grace_s=30.0)
        if self.bus is not None:
            await self.bus.stop()
        await self.api.stop()
        await asyncio.to_thread(self.nats.stop)


Agent = DiscoveryAgent | HealthAgent | AllocationAgent


@dataclass
class NodeAgents:
    """The agents of nodes `first` .. `first + count - 1`, in this process."""

    bus: BusProfile
    kube: KubeSettings
    workdir: Path
    first: int
    count: int
    start_concurrency: int = _START_CONCURRENCY
    agent_set: str = "all"
    """A key of `AGENT_SETS`."""
    agents: list[Agent] = field(default_factory=list)
    opening: dict[str, str] = field(default_factory=dict)
    """Node → the agent it is opening now (for `bench.scale_tasks.dump_tasks`)."""

    def _agents_of(self, index: int) -> list[Agent]:
        node = node_name(index)
        common: dict[str, Any] = {
            "kube": self.kube,
            "ops": OpsSettings(ops_port=0),
            "node_name": node,
            "driver_name": DRIVER,
        }
        own = node_dir(self.workdir, node)
        allocation = AllocationConfig(
            **common,
            nats=self.bus.settings("allocation", node),
            plugin_registry_dir=own / "registry",
            plugin_data_dir=own / "plugin",
            cdi_root=own / "cdi",
        )
        agents: dict[str, Agent] = {
            "discovery": DiscoveryAgent(
                DiscoveryConfig(
                    **common, sim_profile=str(PROFILE), nats=self.bus.settings("discovery", node)
                )
            ),
            "health": HealthAgent(
                HealthConfig(
                    **common,
                    sim_profile=str(PROFILE),
                    nats=self.bus.settings("health", node),
                    recovery_hold_s=1.0,
                    flap_window_s=0.0,
                )
            ),
            "allocation": AllocationAgent(allocation),
        }
        return [agents[name] for name in AGENT_SETS[self.agent_set]]

    async def run_agents(self, resources: contextlib.AsyncExitStack, tg: asyncio.TaskGroup) -> None:
        """Open every node's agents (a few at a time: each connects to NATS and the API) and
        spawn their tasks in `tg`."""
        gate = asyncio.Semaphore(self.start_concurrency)

        async def start(index: int) -> None:
            node = node_name(index)
            async with gate:
                opened = self._agents_of(index)
                for name, agent in zip(AGENT_SETS[self.agent_set], opened, strict=True):
                    self.opening[node] = name
                    await agent.open(resources)
                    agent.spawn(tg)
                    self.agents.append(agent)
                # The gate holds a node until its agents are on the bus: they connect in the
                # background, and a whole worker's TLS handshakes at once on one event loop
                # outlast their connect timeout and are all tried again, and again.
                self.opening[node] = "bus"
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_CONNECT_WAIT_S):
                        for agent in opened:
                            if agent.bus is not None:
                                await agent.bus.connected.wait()
                del self.opening[node]

        await asyncio.gather(*(start(i) for i in range(self.first, self.first + self.count)))


async def _serve_nodes(nodes: NodeAgents) -> None:
    """Open the nodes' agents, say so on stdout, and run them until SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks, nodes.opening)
    base_rss, base_cpu = rss_mb(), cpu_s()
    try:
        async with contextlib.AsyncExitStack() as resources, asyncio.TaskGroup() as tg:
            tg.create_task(_stop_when_orphaned(stop))
            await nodes.run_agents(resources, tg)
            print(
                f"{_WORKER_READY} base_rss_mb={base_rss:.1f} base_cpu_s={base_cpu:.2f}", flush=True
            )
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


def _small_tls_read_buffers() -> None:
    """asyncio gives each TLS connection a read buffer of its own, zeroed when it opens:
    256 KiB (`SSLProtocol.max_size`), a MiB per simulated node of three agents, about half of
    a worker's memory. A node's agents read a few KiB at a time (a TLS record holds 16 KiB at
    most), so a worker reads through 32 KiB buffers and fits 5,000 nodes of three agents
    where 256 KiB ones do not. On a real node the agents are three processes and keep
    asyncio's size."""
    asyncio.sslproto.SSLProtocol.max_size = _TLS_READ_BUFFER


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.scale_fleet", description="one fleet worker")
    parser.add_argument("--first", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    BusProfile.add_flags(parser)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--start-concurrency", type=int, default=_START_CONCURRENCY)
    parser.add_argument("--agents", choices=sorted(AGENT_SETS), default="all")
    args = parser.parse_args()
    _small_tls_read_buffers()
    # Warnings too: a converged fleet has none, and one that does not converge says why.
    logging.configure(LogSettings(level="warning", format="console"), service="scale-worker")
    nodes = NodeAgents(
        bus=BusProfile.from_flags(args),
        kube=KubeSettings(kubeconfig=str(args.kubeconfig), request_timeout_s=30.0),
        workdir=args.workdir,
        first=args.first,
        count=args.count,
        start_concurrency=args.start_concurrency,
        agent_set=args.agents,
    )
    asyncio.run(_serve_nodes(nodes))


if __name__ == "__main__":
    main()
