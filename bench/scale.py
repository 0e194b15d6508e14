"""`make scale`: a fleet of N simulated nodes (default 5,000 x 8 NPUs), each running the real
discovery, health and allocation agents in worker processes (bench.scale_fleet), against a
3-server NATS cluster (buckets and the alert stream with 3 replicas) and an API server.

`--apiserver real` (the default where `make k8s` has built the control plane): etcd and
kube-apiserver through devcluster.controlplane, the agents as the cluster admin;
`--apiserver emulator`: the project's API emulator. `--bus secure` (the default): TLS, the auth
callout (`dra-nats-auth` reviewing every agent's node-bound ServiceAccount token) and signed
records that every reader checks; `--bus open`: no auth, no TLS (bench.scale_bus).

Phases and figures (merged into bench/results.json):
- converge: every node's inventory in the KV and its ResourceSlice in the API
  (`scale_converge_s`), with the CPU seconds each process used meanwhile
  (`scale_converge_cpu_s_{agents,apiserver,etcd,emulator,nats,auth}`: the largest is the
  bottleneck; `scale_converge_cpu_ms_per_node`: the agents' CPU per node), the API requests the
  fleet made (`scale_api_requests_per_node`), and on the secure bus the connections the auth
  service admitted per second (`scale_auth_connects_per_s`);
- at rest for `--steady-s`, once every agent has finished starting and the health agents write
  no faster than their refreshes (`scale_settle_s` after convergence): API requests (watches
  aside) and writes (`scale_steady_api_writes_60s`, `scale_steady_api_requests_per_node_min`),
  messages the agents published (`scale_steady_nats_msgs_per_node_min`, from each server's
  client connections), each shared process's CPU (`scale_steady_cpu_s_*`);
- the same window again with the machine busy (`scale_steady_busy_*`): a CPU hog process per
  core, as other work on a node would run; on the open bus, the KV watch (re)starts seen
  (`scale_watch_restarts`: a node agent's watch of a pattern of keys lists them with a stream
  info request at each (re)start, any other watch creates a consumer) and what the agents
  published there, by subject family (`scale_steady_busy_subjects`);
- prepares: claims prepared and unprepared at an even pace through the allocation agents'
  DRA gRPC sockets, as the kubelet calls them (bench.scale_prepares);
- a fault storm, 10 % of all devices failing within 10 s through the agents' fault control:
  `scale_fault_storm_alerts_per_s`, and on the open bus the alert stream's own capacity, a
  burst published as fast as the cluster acks it (`scale_alert_stream_burst_per_s`); a durable
  consumer counts `scale_alerts_lost` and `scale_alerts_duplicated` over both;
- memory: `scale_nats_server_rss_mb` (the largest server), `scale_apiserver_rss_mb`,
  `scale_etcd_rss_mb`, `scale_auth_rss_mb`, `scale_sim_rss_mb_per_node`;
  `scale_dractl_health_all_s` (`dractl health --all-nodes -o json` as a process; on the secure
  bus as an operator, checking every record's signature), and again with the simulated agents
  paused (`scale_dractl_health_all_agents_paused_s`), as on a fleet whose agents run on their
  own nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.js import api

from bench import scale_apiserver, scale_prepares
from bench.scale_bus import SECURE_BUS
from bench.scale_fleet import AGENT_SETS, DRIVER, Fleet, cpu_s, node_name, rss_mb
from services.dractl import queries
from shared import logging
from shared.bus import codec
from shared.bus.connection import Bus
from shared.bus.session import open_bus
from shared.bus.subjects import Names
from shared.config import LogSettings
from shared.errors import DraSuiteError
from shared.kube import resources
from shared.kube.client import KubeClient
from shared.pb.drasuite.v1 import alert_pb2, health_pb2

__all__ = ["main", "measure"]

DEVICES_PER_NODE = 8
STORM_FRACTION = 0.1
STORM_WINDOW_S = 10.0
BURST = 10_000
_AUDIT = "scale-audit"
_AUDIT_PATIENCE_S = 180.0
_SETTLE_S = 15.0
_SETTLE_WINDOW_S = 10.0
_SETTLED_MSGS_PER_NODE_MIN = 0.05
_SERVER_SENT = ("_INBOX.", Names.kv_followed("", "").removesuffix("."), "$JS.EVENT.")
_PROGRESS_EVERY_S = 15.0
_STORM_QUIET_S = 5.0
_HEALTH_REFRESH_S = 600.0  # the health agents' default --health-refresh-s


async def _wait(probe: Any, *, what: str, timeout_s: float, every_s: float = 1.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s}s")
        await asyncio.sleep(every_s)


class _Published:
    """Node-seconds of published inventories while the fleet converges: how long the nodes
    that were up already sat at rest, each costing the at-rest CPU meanwhile."""

    def __init__(self, start: float) -> None:
        self.node_s = 0.0
        self._last = (start, 0)

    def sample(self, inventories: int) -> None:
        now = time.monotonic()
        at, before = self._last
        self.node_s += (now - at) * (before + inventories) / 2
        self._last = (now, inventories)

    @property
    def last(self) -> int:
        return self._last[1]


def _start_cost(figures: dict[str, Any], *, nodes: int) -> dict[str, Any]:
    """The agents' CPU per node to start, as a real node spends it: the convergence CPU less
    what the nodes already up spent at rest meanwhile (the at-rest window's rate times their
    node-seconds). On one machine the fleet starts a few nodes at a time, so that the more
    nodes, the longer the early ones idle inside `scale_converge_cpu_ms_per_node`."""
    at_rest_per_node_s = figures["scale_steady_cpu_s_agents"] / figures["scale_steady_s"] / nodes
    idle_s = at_rest_per_node_s * figures["scale_converge_node_s"]
    start_s = figures["scale_converge_cpu_s_agents"] - idle_s
    return {
        "scale_rest_cpu_ms_per_node_min": round(at_rest_per_node_s * 60_000, 2),
        "scale_converge_idle_cpu_s_agents": round(idle_s, 1),
        "scale_start_cpu_ms_per_node": round(start_s * 1000 / nodes, 1),
    }


async def _report_progress(fleet: Fleet, bus: Bus, published: _Published, *, start: float) -> None:
    """While the fleet converges: the inventories on the bus every second (`published`), and
    every `_PROGRESS_EVERY_S` a line on stderr of how far it got (inventories, agents
    connected, connects the auth service admitted)."""
    while True:
        for _ in range(int(_PROGRESS_EVERY_S)):
            await asyncio.sleep(1.0)
            published.sample(await _inventories(bus))
        connections = sum(v.get("connections", 0) for v in await asyncio.to_thread(fleet.varz))
        admitted = await fleet.bus.authorized() if fleet.bus is not None else None
        print(
            f"converging: {time.monotonic() - start:.0f}s, {published.last} of"
            f" {fleet.nodes} inventories, {connections} connections, admitted {admitted}",
            file=sys.stderr,
            flush=True,
        )


async def _inventories(bus: Bus) -> int:
    try:
        info = await bus.js.stream_info(bus.names.kv_stream(bus.names.inventory_bucket))
    except (nats.errors.Error, TimeoutError):
        return 0
    return int(info.state.messages)  # history 1: one message per key


async def _health_seq(bus: Bus) -> int:
    try:
        info = await bus.js.stream_info(bus.names.kv_stream(bus.names.health_bucket))
    except (nats.errors.Error, TimeoutError):
        return 0
    return int(info.state.last_seq)


async def _settle(fleet: Fleet, bus: Bus, *, timeout_s: float) -> float:
    """Seconds until the fleet is at rest: the health agents write no faster than their
    refreshes (every record about once per `_HEALTH_REFRESH_S`), and the other agents have
    finished starting (together under `_SETTLED_MSGS_PER_NODE_MIN`). Converged inventories and
    slices come before every health agent has written its first records and evaluated the
    inventory, and before the last allocation agents, slowed by a loaded start, have read their
    keys."""
    start = time.monotonic()
    devices = fleet.nodes * DEVICES_PER_NODE
    at_rest = devices * _SETTLE_WINDOW_S / _HEALTH_REFRESH_S * 2 + 5
    quiet = _SETTLED_MSGS_PER_NODE_MIN * fleet.nodes * _SETTLE_WINDOW_S / 60.0
    before, sent_before = await _health_seq(bus), await asyncio.to_thread(fleet.client_msgs)
    while time.monotonic() - start < timeout_s:
        await asyncio.sleep(_SETTLE_WINDOW_S)
        now, sent = await _health_seq(bus), await asyncio.to_thread(fleet.client_msgs)
        others = sum(sent[a] - sent_before[a] for a in sent if a != "health")
        if now - before <= at_rest and abs(others) <= quiet:
            break
        before, sent_before = now, sent
    return round(time.monotonic() - start, 1)


async def _slice_nodes(kube: KubeClient) -> int:
    listed = await kube.list(resources.RESOURCE_SLICES)
    return len({item["spec"].get("nodeName") for item in listed["items"]})


def _cpu(fleet: Fleet) -> dict[str, float]:
    """CPU seconds so far: the agents (every worker, less what each spent starting) and each
    shared process."""
    found = {"agents": sum(cpu_s(pid) for pid in fleet.worker_pids()) - fleet.worker_base_cpu_s}
    for name, pids in fleet.service_pids().items():
        found[name] = sum(cpu_s(pid) for pid in pids)
    return found


def _cpu_since(fleet: Fleet, before: dict[str, float]) -> dict[str, float]:
    return {name: round(v - before.get(name, 0.0), 1) for name, v in _cpu(fleet).items()}


def _rss(fleet: Fleet) -> dict[str, float]:
    """Resident MiB of each shared process (NATS: the largest server)."""
    found = {}
    for name, pids in fleet.service_pids().items():
        found[f"scale_{'nats_server' if name == 'nats' else name}_rss_mb"] = round(
            max(rss_mb(pid) for pid in pids), 1
        )
    return found


def _start_requests(calls: Counter[str], *, nodes: int, probes: int) -> dict[str, Any]:
    """What each node asked of the API server while the fleet converged (the harness's own
    convergence probes aside)."""
    watches = calls["watch"]
    requests = sum(calls.values()) - watches - probes
    writes = sum(calls[v] for v in ("create", "update", "patch", "delete"))
    return {
        "scale_api_requests_per_node": round(requests / nodes, 2),
        "scale_converge_api_writes_per_node": round(writes / nodes, 2),
        "scale_api_watches_per_node": round(watches / nodes, 2),
        "scale_converge_api_requests_by_verb": dict(calls),
    }


async def _steady(fleet: Fleet, bus: Bus, *, seconds: float) -> dict[str, Any]:
    # The first health records and evaluations of a fresh start are not "at rest".
    settle_s = await _settle(fleet, bus, timeout_s=300.0)
    await fleet.api.mark()
    cpu_before = _cpu(fleet)
    async with _published(bus, enabled=fleet.bus is None) as seen:
        msgs_before = fleet.client_msgs()
        await asyncio.sleep(seconds)
        by_agent = fleet.client_msgs()
    cpu = _cpu_since(fleet, cpu_before)
    by_agent.subtract(msgs_before)
    msgs = sum(by_agent.values())
    calls = await fleet.api.since_mark()
    requests = sum(calls.values()) - calls["watch"]
    writes = sum(calls[v] for v in ("create", "update", "patch", "delete"))
    per_min = 60.0 / seconds / fleet.nodes
    return {
        "scale_steady_s": seconds,
        "scale_settle_s": settle_s,
        "scale_steady_api_writes_60s": round(writes * 60.0 / seconds),
        "scale_steady_api_requests_per_node_min": round(requests * per_min, 4),
        "scale_steady_nats_msgs_per_node_min": round(msgs * per_min, 3),
        **{
            f"scale_steady_nats_msgs_per_node_min_{agent}": round(count * per_min, 3)
            for agent, count in sorted(by_agent.items())
        },
        **{f"scale_steady_cpu_s_{name}": value for name, value in cpu.items()},
        **_watch_figures("scale_steady", seen, enabled=fleet.bus is None),
    }


def _watch_figures(prefix: str, seen: Counter[str], *, enabled: bool) -> dict[str, Any]:
    """Watch (re)starts and published subjects, which only the open bus lets us see."""
    if not enabled:
        return {}
    return {
        f"{prefix}_watch_restarts": seen["$JS.API.CONSUMER.CREATE"] + seen["$JS.API.STREAM.INFO"],
        f"{prefix}_subjects": dict(seen.most_common(8)),
    }


# Busy until its parent is gone: a harness killed in the busy window leaves no hog behind.
_HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"


@contextlib.contextmanager
def _cpu_hogs(count: int) -> Iterator[None]:
    """`count` processes that each keep a core busy."""
    hogs = [subprocess.Popen([sys.executable, "-c", _HOG]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def _family(subject: str) -> str:
    """`$KV.dra_health.<key>` -> `$KV.dra_health`; `$JS.API.CONSUMER.CREATE.<...>` -> its verb."""
    tokens = subject.split(".")
    if tokens[:2] == ["$JS", "API"]:
        return ".".join(tokens[:4])
    return ".".join(tokens[:2])


@contextlib.asynccontextmanager
async def _published(bus: Bus, *, enabled: bool = True) -> AsyncIterator[Counter[str]]:
    """What clients publish (the open bus lets a `>` subscription see it, the secure one lets
    nobody), by subject family; what the server sends (deliveries to inboxes, the buckets'
    republished copies, advisories) aside."""
    seen: Counter[str] = Counter()
    if not enabled:
        yield seen
        return

    async def count(msg: Msg) -> None:
        if not msg.subject.startswith(_SERVER_SENT):
            seen[_family(msg.subject)] += 1

    subscription = await bus.nc.subscribe(">", cb=count)
    try:
        yield seen
    finally:
        await subscription.unsubscribe()


async def _steady_busy(fleet: Fleet, bus: Bus, *, seconds: float) -> dict[str, Any]:
    """The at-rest window again while every core is busy with something else."""
    cores = os.cpu_count() or 1
    with _cpu_hogs(cores):
        await asyncio.sleep(_SETTLE_S)  # the agents' loops fall behind first
        async with _published(bus, enabled=fleet.bus is None) as seen:
            msgs_before = fleet.client_msgs()
            await asyncio.sleep(seconds)
            by_agent = fleet.client_msgs()
    by_agent.subtract(msgs_before)
    per_min = 60.0 / seconds / fleet.nodes
    return {
        "scale_steady_busy_hogs": cores,
        "scale_steady_busy_nats_msgs_per_node_min": round(sum(by_agent.values()) * per_min, 3),
        **{
            f"scale_steady_busy_nats_msgs_per_node_min_{agent}": round(count * per_min, 3)
            for agent, count in sorted(by_agent.items())
        },
        **_watch_figures("scale_steady_busy", seen, enabled=fleet.bus is None),
    }


async def _storm(bus: Bus, fleet: Fleet) -> tuple[dict[str, float], set[str]]:
    """10 % of the devices fail within 10 s (fault commands at an even pace), then up to 60 s
    for their alerts: the rate the stream received them at, how long after the window the last
    one was stored, and how many commands or alerts did not make it."""
    pairs = [(node_name(n), f"npu-{d}") for n in range(fleet.nodes) for d in range(8)]
    failed = random.Random(7).sample(pairs, max(1, int(len(pairs) * STORM_FRACTION)))
    refused: list[str] = []
    accepted: set[str] = set()
    start = time.monotonic()

    async def fail(index: int, node: str, device: str) -> None:
        await asyncio.sleep(start + index * STORM_WINDOW_S / len(failed) - time.monotonic())
        command = health_pb2.FaultCommand(device=device, cause="xid", code="79")
        for _ in range(5):
            try:
                await queries.inject_fault(bus, driver=DRIVER, node=node, command=command)
                accepted.add(f"{node}/{device}/{alert_pb2.ALERT_STATUS_RAISED}")
                return
            except DraSuiteError as exc:
                error = str(exc)
                await asyncio.sleep(0.5)
        refused.append(error)

    await asyncio.gather(*(fail(i, n, d) for i, (n, d) in enumerate(failed)))
    # A command that timed out at this end may still have made its fault (and its alert): the
    # count reaches the accepted ones before all of theirs are in. Until it stops growing.
    expected = len(failed) - len(refused)
    settled = _Settling()
    with contextlib.suppress(TimeoutError):
        await _wait(
            lambda: settled.done(bus, at_least=expected),
            what="storm alerts",
            timeout_s=60,
            every_s=0.2,
        )
    elapsed = time.monotonic() - start - (settled.quiet_for() if settled.count else 0.0)
    stored = settled.count
    return {
        "scale_fault_storm_faults": len(failed),
        "scale_fault_storm_commands_failed": len(refused),
        "scale_fault_storm_alerts_stored": stored,
        "scale_fault_storm_alerts_per_s": round(stored / elapsed, 1),
        "scale_fault_storm_tail_s": round(elapsed - STORM_WINDOW_S, 2),
    }, accepted


class _Settling:
    """The alert stream's count, until it holds at least what was expected and has not grown
    for `_STORM_QUIET_S`."""

    def __init__(self) -> None:
        self.count = 0
        self._since = time.monotonic()

    def quiet_for(self) -> float:
        return time.monotonic() - self._since

    async def done(self, bus: Bus, *, at_least: int) -> bool:
        count = int((await bus.js.stream_info(bus.names.alerts_stream)).state.messages)
        if count != self.count:
            self.count, self._since = count, time.monotonic()
        return count >= at_least and self.quiet_for() >= _STORM_QUIET_S


async def _burst(bus: Bus) -> float:
    """BURST alerts published as fast as the cluster acks them (msg ids, as agents send)."""
    start = time.monotonic()
    gate = asyncio.Semaphore(256)

    async def publish(index: int) -> None:
        node = node_name(index % 1000)
        alert = alert_pb2.Alert(
            id=f"burst-{index}", status=alert_pb2.ALERT_STATUS_RAISED, driver=DRIVER, node=node
        )
        async with gate:
            await bus.publish_js(
                bus.names.alerts(DRIVER, node), codec.encode_json(alert), msg_id=alert.id
            )

    await asyncio.gather(*(publish(i) for i in range(BURST)))
    return BURST / (time.monotonic() - start)


async def _audit(bus: Bus, *, expected: set[str]) -> Counter[str]:
    """Every alert id the durable consumer is handed, counted: until it has handed every
    `expected` one, or nothing more for 3 s once `_AUDIT_PATIENCE_S` have passed. On a
    machine this busy a health agent can store an alert minutes late (its connection
    reconnecting, its stream requests timing out); late is not lost."""
    subscription = await bus.js.pull_subscribe(
        bus.names.alerts_wildcard,
        durable=_AUDIT,
        stream=bus.names.alerts_stream,
        config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
    )
    seen: Counter[str] = Counter()
    give_up_at = time.monotonic() + _AUDIT_PATIENCE_S
    try:
        while True:
            try:
                batch = await subscription.fetch(1000, timeout=3)
            except (nats.errors.TimeoutError, TimeoutError):
                if expected <= set(seen) or time.monotonic() >= give_up_at:
                    return seen
                continue
            for msg in batch:
                alert = codec.decode_json(alert_pb2.Alert, msg.data, subject=msg.subject)
                key = alert.id if alert.id.startswith("burst-") else f"{alert.node}/{alert.device}"
                seen[f"{key}/{alert.status}"] += 1
                await msg.ack()
    finally:
        # A timed-out fetch's late answer waits in the subscription's queue with nobody to
        # read it, and the harness's closing drain would wait on it in vain.
        await subscription.unsubscribe()


async def _dractl_health_all(fleet: Fleet) -> dict[str, float]:
    """`dractl health --all-nodes -o json` as an operator runs it: its wall time on this
    machine shared with the fleet's agents, and its own CPU, which is what it would take on
    an operator's machine of its own. Then once more with the simulated agents paused
    (SIGSTOP, for seconds: well inside their servers' ping deadline), as on a real fleet
    whose agents run on their own nodes: the NATS servers and the records are the same."""
    wall_s, cpu_s = await _dractl_run(fleet)
    figures = {"scale_dractl_health_all_s": wall_s, "scale_dractl_health_all_cpu_s": cpu_s}
    with _paused(fleet.worker_pids()):
        wall_s, cpu_s = await _dractl_run(fleet)
    figures["scale_dractl_health_all_agents_paused_s"] = wall_s
    figures["scale_dractl_health_all_agents_paused_cpu_s"] = cpu_s
    return figures


async def _dractl_run(fleet: Fleet) -> tuple[float, float]:
    """One `dractl health --all-nodes`: (wall s, its CPU s)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.dractl",
        f"--nats-url={fleet.nats.url}",
        f"--driver-name={DRIVER}",
        "--nats-connect-timeout-s=10",
        *(fleet.bus.operator_flags() if fleet.bus is not None else []),
        *("-o", "json", "health", "--all-nodes"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    elapsed = time.monotonic() - start
    if process.returncode != 0:
        raise RuntimeError(f"dractl health --all-nodes: {err.decode()[-300:]}")
    counts = json.loads(out)["counts"]
    if counts["nodes"] != fleet.nodes:
        raise RuntimeError(f"dractl health --all-nodes: {counts} {err.decode()[-500:]}")
    spent = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = spent.ru_utime + spent.ru_stime - children.ru_utime - children.ru_stime
    return round(elapsed, 2), round(cpu_s, 2)


@contextlib.contextmanager
def _paused(pids: Iterable[int]) -> Iterator[None]:
    """The processes stopped (SIGSTOP) inside the block, continued after it, however it ends."""
    stopped: list[int] = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        yield
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def measure(
    *, nodes: int, steady_s: float, workdir: Path, apiserver: str, bus: str, agents: str = "all"
) -> dict[str, Any]:
    api = scale_apiserver.choose(apiserver, workdir)
    fleet = Fleet(workdir, nodes, api=api, secure=bus == "secure", agents=agents)
    figures: dict[str, Any] = {
        "scale_nodes": nodes,
        "scale_devices": nodes * DEVICES_PER_NODE,
        "scale_agents": "+".join(AGENT_SETS[agents]),
    }
    try:
        started = time.monotonic()
        await fleet.start_services()
        figures["scale_services_start_s"] = round(time.monotonic() - started, 1)
        figures["scale_apiserver"] = await api.version()
        async with (
            open_bus(fleet.nats_settings, timeout_s=10) as harness,
            contextlib.AsyncExitStack() as stack,
        ):
            kube = await KubeClient.connect(fleet.kube_settings)
            stack.push_async_callback(kube.close)
            figures |= await _converge(fleet, harness, kube)
            await _phases(figures, fleet, harness, kube, steady_s=steady_s)
    finally:
        await fleet.stop_services()
    return figures


async def _converge(fleet: Fleet, bus: Bus, kube: KubeClient) -> dict[str, Any]:
    nodes = fleet.nodes
    await fleet.api.mark()
    admitted = await fleet.bus.authorized() if fleet.bus is not None else 0
    cpu_before, start = _cpu(fleet), time.monotonic()
    timeout_s = max(120.0, nodes * 0.5)
    published = _Published(start)
    probes = 0
    seen = {"inventories": 0, "slice_nodes": 0}

    async def converged() -> bool:
        nonlocal probes
        seen["inventories"] = await _inventories(bus)
        published.sample(seen["inventories"])
        if seen["inventories"] < nodes:
            return False
        probes += 1
        seen["slice_nodes"] = await _slice_nodes(kube)
        return seen["slice_nodes"] >= nodes

    reporter = asyncio.create_task(_report_progress(fleet, bus, published, start=start))
    try:
        await fleet.start_workers(timeout_s=timeout_s)
        cpu_before["agents"] = 0.0  # counted from each worker's first node (`worker_base_cpu_s`)
        await _wait(converged, what="convergence", timeout_s=timeout_s - (time.monotonic() - start))
    except TimeoutError as exc:
        await fleet.dump_worker_tasks()
        raise TimeoutError(
            f"{exc or 'the workers did not open every node'}: {seen} of {nodes} nodes"
            f" (worker logs, with what their tasks wait on, in {fleet.workdir})"
        ) from None
    finally:
        reporter.cancel()
    figures: dict[str, Any] = {"scale_converge_s": round(time.monotonic() - start, 2)}
    published.sample(nodes)
    figures["scale_converge_node_s"] = round(published.node_s)
    spent = _cpu_since(fleet, cpu_before)
    figures |= {f"scale_converge_cpu_s_{k}": v for k, v in spent.items()}
    figures["scale_converge_cpu_ms_per_node"] = round(spent["agents"] * 1000 / nodes, 1)
    if fleet.bus is not None:
        admitted = await fleet.bus.authorized() - admitted
        figures["scale_auth_connects"] = admitted
        figures["scale_auth_connects_per_s"] = round(admitted / figures["scale_converge_s"], 1)
    held = sum(rss_mb(pid) for pid in fleet.worker_pids()) - fleet.worker_base_rss_mb
    figures["scale_sim_rss_mb_per_node"] = round(held / nodes, 3)
    figures["scale_sim_workers"] = len(fleet.workers)
    figures |= _start_requests(await fleet.api.since_mark(), nodes=nodes, probes=probes)
    figures |= {f"{k}_converged": v for k, v in _rss(fleet).items()}
    return figures


async def _phases(
    figures: dict[str, Any], fleet: Fleet, bus: Bus, kube: KubeClient, *, steady_s: float
) -> None:
    """The phases after convergence; one that fails is named in `scale_errors`, the others'
    figures stay."""
    errors: list[str] = []
    figures["scale_errors"] = errors
    expected: set[str] = set()

    async def storm() -> None:
        found, accepted = await _storm(bus, fleet)
        figures.update(found)
        expected.update(accepted)

    async def burst() -> None:
        figures["scale_alert_stream_burst_per_s"] = round(await _burst(bus), 1)
        expected.update(f"burst-{i}/{alert_pb2.ALERT_STATUS_RAISED}" for i in range(BURST))

    async def audit() -> None:
        seen = await _audit(bus, expected=expected)
        figures["scale_alerts_duplicated"] = sum(n - 1 for n in seen.values())
        figures["scale_alerts_lost"] = len(expected - set(seen))

    async def dractl() -> None:
        figures.update(await _dractl_health_all(fleet))

    async def steady() -> None:
        figures.update(await _steady(fleet, bus, seconds=steady_s))
        figures.update(_start_cost(figures, nodes=fleet.nodes))

    async def steady_busy() -> None:
        figures.update(await _steady_busy(fleet, bus, seconds=steady_s))

    async def prepares() -> None:
        figures.update(await scale_prepares.measure(fleet, kube, seconds=steady_s))

    # The secure bus lets no harness publish alerts (only a node's health agent may).
    bursts = (burst,) if fleet.bus is None else ()
    preparing = (prepares,) if "allocation" in AGENT_SETS[fleet.agents] else ()
    for phase in (steady, steady_busy, *preparing, storm, *bursts, audit, dractl):
        try:
            await phase()
        except Exception as exc:  # a failed phase is a figure too; the others still count
            errors.append(f"{phase.__name__}: {type(exc).__name__}: {exc}")
    figures |= _rss(fleet)


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--steady-s", type=float, default=60.0)
    parser.add_argument(
        "--apiserver",
        choices=("auto", "real", "emulator"),
        default="auto",
        help="auto: the real kube-apiserver and etcd where `make k8s` built them",
    )
    parser.add_argument("--bus", choices=("secure", "open"), default="secure")
    parser.add_argument(
        "--agents",
        choices=sorted(AGENT_SETS),
        default="all",
        help="all three agents per node, or discovery and health only (a larger fleet)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the run's files (worker and server logs) here instead of a temporary dir",
    )
    args = parser.parse_args()
    logging.configure(LogSettings(level="error", format="console"), service="scale")
    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dra-scale-")))
        else:
            workdir = args.workdir
            workdir.mkdir(parents=True, exist_ok=True)
        figures = asyncio.run(
            measure(
                nodes=args.nodes,
                steady_s=args.steady_s,
                workdir=workdir,
                apiserver=args.apiserver,
                bus=args.bus,
                agents=args.agents,
            )
        )
    figures["scale_bus"] = (
        f"{SECURE_BUS}, 3-server JetStream cluster, R3"
        if args.bus == "secure"
        else "open (no auth callout, no TLS), 3-server JetStream cluster, R3"
    )
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    # One run's figures, none left over from another run (another size, bus or agent set).
    results = {k: v for k, v in results.items() if not k.startswith("scale_")} | figures
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
