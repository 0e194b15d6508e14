"""The whole suite on one machine: nats-server, the API emulator (or the real control plane)
and the three agents.

Every piece is a real process, wired the way a node would wire them (kubeconfig, plugin
registry and data dirs, CDI root) under one work directory, which it holds locked while it runs.
Each process has its own process group, so a Ctrl-C reaches only our process, and `stop()`
stops the agents first (they drain NATS and deregister), then the API emulator, then NATS.
With `control_plane="real"` kube-apiserver, kube-scheduler and kube-controller-manager built by
`make k8s` take the emulator's place (devcluster/controlplane). Used by
`devcluster demo`, `devcluster up` and the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from devcluster.controlplane import (
    RealControlPlane,
    cached_binaries,
    register_node,
    release,
)
from devcluster.natscluster import NATSCluster
from devcluster.natsserver import NATSServerProcess
from devcluster.processes import ChildProcess, devcluster_env
from devcluster.workdir import WorkdirLock
from shared.config import KubeSettings, NATSSettings
from shared.kube import resources
from shared.kube.client import KubeClient

__all__ = ["AGENTS", "OPEN_BUS_WARNING", "LocalStack", "StackConfig"]

AGENTS = ("discovery", "allocation", "health")
BACKEND = "sim"
"""The local stack's one backend: sim devices from `StackConfig.sim_profile`."""
OPEN_BUS_WARNING = (
    "WARNING: open bus. This local stack's nats-server has no authentication and no TLS "
    "(it listens on 127.0.0.1 only): any local process can rewrite inventories, forge health "
    "records and inject faults. For development only; a cluster install (deploy/kustomize) runs "
    "NATS authenticated, TLS-only and fenced."
)
"""What `devcluster demo` and `devcluster up` say when they start (docs/security.md)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StackConfig:
    workdir: Path
    node_name: str = "demo-node"
    driver_name: str = "sim.dra-suite.io"
    sim_profile: str = "mixed"
    kubernetes_version: str = "1.36"
    control_plane: str = "emulator"
    """`emulator`, the embedded API emulator (1.34-1.36), or `real`: kube-apiserver,
    kube-scheduler and kube-controller-manager of `kubernetes_version` (1.34-1.37), built by
    `make k8s`; the feature gates are then the release table's, not `feature_gates`."""
    # DeviceTaintRules are off by default even in 1.36; the demo turns them on, as a cluster
    # that wants the health agent's taints must.
    feature_gates: str = "DRADeviceTaints=true,DRADeviceTaintRules=true"
    log_level: str = "info"
    recovery_hold_s: float = 1.0
    nats_namespace: str = ""
    nats_cluster: int = 1
    """nats-servers: 1, or a JetStream cluster on loopback whose buckets get that many
    replicas (`--nats-cluster 3`)."""
    nats_watch_heartbeat_s: float | None = None
    """The agents' `--nats-watch-heartbeat-s`; None: their default. A test that kills servers
    sets a short one, so a consumer watch (the quota auditor's) whose consumer died restarts
    within seconds; the node agents' watches hold no consumer."""
    extra_args: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """More flags per agent, e.g. `(("health", ("--kube-request-timeout-s", "1")),)`."""
    cdi_dir: Path | None = None
    """Where CDI specs go; default `<workdir>/cdi`. Real nodes keep them in /var/run/cdi, a
    tmpfs: the benchmarks put them on one too, so fsyncs cost there what they cost on a node."""

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig.yaml"

    @property
    def registry_dir(self) -> Path:
        return self.workdir / "kubelet" / "plugins_registry"

    @property
    def plugin_data_dir(self) -> Path:
        return self.workdir / "kubelet" / "plugins" / self.driver_name

    @property
    def cdi_root(self) -> Path:
        return self.cdi_dir or self.workdir / "cdi"

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"


@dataclass
class LocalStack:
    config: StackConfig
    nats: NATSServerProcess | NATSCluster | None = None
    apiserver: ChildProcess | None = None
    agents: dict[str, ChildProcess] = field(default_factory=dict)
    api_url: str = ""
    """The API server's base URL (the emulator's `/_emulator` test-control endpoints live there
    too)."""
    real: RealControlPlane | None = None
    """The real control plane, when `config.control_plane == "real"`."""
    ops_ports: dict[str, int] = field(default_factory=dict)
    _lock: WorkdirLock | None = None

    @property
    def nats_settings(self) -> NATSSettings:
        assert self.nats is not None
        return NATSSettings(
            url=self.nats.url,
            namespace=self.config.nats_namespace,
            replicas=self.config.nats_cluster,
        )

    @property
    def kube_settings(self) -> KubeSettings:
        return KubeSettings(kubeconfig=str(self.config.kubeconfig))

    async def start(self, *, fresh: bool = True) -> None:
        cfg = self.config
        lock = WorkdirLock(cfg.workdir)
        lock.acquire()  # before touching anything: another stack may be running here
        self._lock = lock
        if fresh:
            lock.clear()
        for directory in (cfg.registry_dir, cfg.plugin_data_dir, cfg.cdi_root, cfg.logs_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if cfg.nats_cluster > 1:
            self.nats = NATSCluster(
                cfg.workdir / "nats", size=cfg.nats_cluster, own_process_group=True
            )
        else:
            self.nats = NATSServerProcess(cfg.workdir / "nats", own_process_group=True)
        await asyncio.to_thread(self.nats.start)
        servers = self.nats.servers if isinstance(self.nats, NATSCluster) else [self.nats]
        for server in servers:
            lock.record("nats-server", server.pid)
        await self._start_apiserver()
        await self._register_node()
        for agent in AGENTS:
            await self.start_agent(agent)

    async def _start_apiserver(self) -> None:
        cfg = self.config
        if cfg.control_plane == "real":
            await self._start_real_control_plane()
            return
        if cfg.control_plane != "emulator":
            raise ValueError(f"control plane {cfg.control_plane!r}: want emulator or real")
        self.apiserver = ChildProcess(
            name="apiserver",
            argv=[
                sys.executable,
                "-m",
                "devcluster.apiserver",
                "--port",
                "0",
                "--kubeconfig",
                str(cfg.kubeconfig),
                "--kubernetes-version",
                cfg.kubernetes_version,
                "--feature-gates",
                cfg.feature_gates,
            ],
            log_path=cfg.logs_dir / "apiserver.log",
            env=devcluster_env(),
        )
        await self.apiserver.start()
        self._record("apiserver", self.apiserver.pid)
        line = await self.apiserver.read_line_until("apiserver_ready", timeout_s=30)
        self.api_url = line.split("url=", 1)[-1].strip()

    async def _start_real_control_plane(self) -> None:
        """kube-apiserver and friends from the machine's cache; the admin kubeconfig is the
        stack's (ControlPlaneNotBuiltError says how to build them when they are missing)."""
        cfg = self.config
        binaries = cached_binaries(release(cfg.kubernetes_version))
        self.real = RealControlPlane(binaries, cfg.workdir / "control-plane")
        await self.real.start()
        shutil.copyfile(self.real.admin_kubeconfig, cfg.kubeconfig)
        self.api_url = self.real.url

    async def _register_node(self) -> None:
        """What the kubelet would have done: the Node object exists before the agents start."""
        if self.real is not None:
            async with self.kube() as kube:
                await register_node(kube, self.config.node_name)
            return
        async with self.kube() as kube:
            node: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": self.config.node_name,
                    "labels": {"kubernetes.io/hostname": self.config.node_name},
                },
            }
            await kube.create(resources.NODES, node)

    def ops_port(self, agent: str) -> int:
        """The agent's /metrics, /healthz and /readyz port, kept across its restarts."""
        if agent not in self.ops_ports:
            self.ops_ports[agent] = _free_port()
        return self.ops_ports[agent]

    def ops_url(self, agent: str, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.ops_port(agent)}{path}"

    def agent_argv(self, agent: str) -> list[str]:
        cfg = self.config
        assert self.nats is not None
        argv = [
            sys.executable,
            "-m",
            f"services.{agent}",
            "--node-name",
            cfg.node_name,
            "--driver-name",
            cfg.driver_name,
            "--nats-url",
            self.nats.url,
            "--kubeconfig",
            str(cfg.kubeconfig),
            "--log-level",
            cfg.log_level,
        ]
        if cfg.nats_namespace:
            argv += ["--nats-namespace", cfg.nats_namespace]
        if cfg.nats_cluster > 1:
            argv += ["--nats-replicas", str(cfg.nats_cluster)]
        if cfg.nats_watch_heartbeat_s is not None:
            argv += ["--nats-watch-heartbeat-s", str(cfg.nats_watch_heartbeat_s)]
        argv += ["--ops-host", "127.0.0.1", "--ops-port", str(self.ops_port(agent))]
        if agent in ("discovery", "allocation"):
            # The node's backend from its own configuration, as a DaemonSet sets it.
            argv += ["--backend", BACKEND]
        if agent in ("discovery", "health"):
            argv += ["--sim-profile", cfg.sim_profile]
        if agent == "health":
            # A short hold keeps the walk brisk; production keeps the 5 s default.
            argv += ["--recovery-hold-s", str(cfg.recovery_hold_s)]
        if agent == "allocation":
            argv += [
                "--plugin-registry-dir",
                str(cfg.registry_dir),
                "--plugin-data-dir",
                str(cfg.plugin_data_dir),
                "--cdi-root",
                str(cfg.cdi_root),
            ]
        for name, extra in cfg.extra_args:
            if name == agent:
                argv += extra
        return argv

    async def start_agent(self, agent: str) -> ChildProcess:
        process = ChildProcess(
            name=agent,
            argv=self.agent_argv(agent),
            log_path=self.config.logs_dir / f"{agent}.log",
        )
        await process.start()
        self._record(agent, process.pid)
        self.agents[agent] = process
        return process

    def _record(self, name: str, pid: int | None) -> None:
        """Note a child in the work dir's lock: if this process is killed, the next stack
        there finds it (`workdir.OrphanedProcessesError`)."""
        if self._lock is not None:
            self._lock.record(name, pid)

    async def wait_agents_ready(self, *, timeout_s: float = 60.0) -> None:
        """Until every running agent answers 200 on /readyz.

        Only then has each installed its stop-signal handlers: a SIGTERM sent to an agent
        still importing would kill it with the signal instead of stopping it cleanly.
        """
        deadline = time.monotonic() + timeout_s
        waiting = dict(self.agents)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
            while waiting:
                for agent, process in list(waiting.items()):
                    if process.returncode is not None:
                        raise RuntimeError(
                            f"{agent} exited {process.returncode} while starting; "
                            f"see {process.log_path}"
                        )
                    try:
                        async with http.get(self.ops_url(agent, "/readyz")) as response:
                            if response.status == 200:
                                del waiting[agent]
                    except (aiohttp.ClientError, TimeoutError):
                        pass
                if waiting and time.monotonic() > deadline:
                    raise TimeoutError(f"not ready after {timeout_s:.0f} s: {sorted(waiting)}")
                if waiting:
                    await asyncio.sleep(0.1)

    async def stop_agent(self, agent: str) -> int | None:
        process = self.agents.pop(agent, None)
        return await process.stop() if process else None

    async def kill_agent(self, agent: str) -> int | None:
        """SIGKILL an agent, as a crash would; `start_agent` brings it back."""
        process = self.agents.pop(agent, None)
        if process is None:
            return None
        return await process.stop(grace_s=5.0, sig=signal.SIGKILL)

    def agent_pids(self) -> dict[str, int | None]:
        return {name: process.pid for name, process in self.agents.items()}

    def exited_agents(self) -> dict[str, str]:
        """Agents that are no longer running, with their exit code and last log line."""
        exited = {}
        for name, process in self.agents.items():
            if process.returncode is not None:
                lines = process.log_path.read_text(errors="replace").strip().splitlines()
                exited[name] = f"exit {process.returncode}: {lines[-1] if lines else '(no log)'}"
        return exited

    def kube(self) -> _KubeSession:
        return _KubeSession(self.kube_settings)

    async def stop(self) -> dict[str, int | None]:
        """Stop agents first (they drain NATS and deregister), then the emulator and NATS.

        The agents stop together; each one's exit code is returned (None: was not running).
        """
        running = [agent for agent in AGENTS if agent in self.agents]
        exits = await asyncio.gather(*(self.stop_agent(agent) for agent in running))
        codes = dict(zip(running, exits, strict=True))
        if self.apiserver is not None:
            await self.apiserver.stop()
            self.apiserver = None
        if self.real is not None:
            await self.real.stop()
            self.real = None
        if self.nats is not None:
            await asyncio.to_thread(self.nats.stop)
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        return codes

    def endpoints(self) -> dict[str, object]:
        """Everything a user (or `devcluster claim`) needs to reach the running stack."""
        cfg = self.config
        assert self.nats is not None
        return {
            "nats_url": self.nats.url,
            "nats_namespace": cfg.nats_namespace,
            "api_url": self.api_url,
            "control_plane": cfg.control_plane,
            "kubeconfig": str(cfg.kubeconfig),
            "cdi_dir": str(cfg.cdi_root),
            "plugin_registry_dir": str(cfg.registry_dir),
            "logs_dir": str(cfg.logs_dir),
            "driver": cfg.driver_name,
            "node": cfg.node_name,
            "ops": {agent: self.ops_url(agent, "") for agent in AGENTS},
        }

    async def __aenter__(self) -> LocalStack:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class _KubeSession:
    """`async with stack.kube() as kube:` a KubeClient on the emulator, closed afterwards."""

    def __init__(self, settings: KubeSettings) -> None:
        self._settings = settings
        self._client: KubeClient | None = None

    async def __aenter__(self) -> KubeClient:
        self._client = await KubeClient.connect(self._settings)
        return self._client

    async def __aexit__(self, *_: object) -> None:
        if self._client is not None:
            await self._client.close()
