"""`make scale`: a fleet of N simulated nodes (default 5,000 x 8 NPUs) running the real
discovery and health agents in worker processes (bench.scale_fleet), against a 3-server NATS
cluster (buckets and the alert stream with 3 replicas) and the API emulator, on the open bus.

Phases and figures (merged into bench/results.json):
- converge: every node's inventory in the KV and its ResourceSlice in the API
  (`scale_converge_s`), with the CPU seconds each process used meanwhile
  (`scale_converge_cpu_s_{sim,emulator,nats}`: the largest is the bottleneck);
- at rest for `--steady-s`, once the health agents write no faster than their refreshes
  (`scale_settle_s` after convergence): API requests (watches aside) and writes
  (`scale_steady_api_writes_60s`, `scale_steady_api_requests_per_node_min`), messages the
  agents published (`scale_steady_nats_msgs_per_node_min`, from each server's client
  connections);
- the same window again with the machine busy (`scale_steady_busy_*`): a CPU hog process per
  core, as other work on a node would run; with both windows, the consumer creations seen
  (`scale_watch_restarts`: each KV watch (re)start creates one) and what the agents published
  there, by subject family (`scale_steady_busy_subjects`);
- a fault storm, 10 % of all devices failing within 10 s through the agents' fault control:
  `scale_fault_storm_alerts_per_s`, and the alert stream's own capacity, a burst published as
  fast as the cluster acks it (`scale_alert_stream_burst_per_s`); a durable consumer counts
  `scale_alerts_lost` and `scale_alerts_duplicated` over both;
- `scale_nats_server_rss_mb` (the largest server), `scale_sim_rss_mb_per_node`,
  `scale_dractl_health_all_s` (`dractl health --all-nodes -o json` as a process).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.js import api

from bench.scale_fleet import DRIVER, Fleet, cpu_s, node_name, rss_mb
from services.dractl import queries
from shared import logging
from shared.bus import codec
from shared.bus.connection import Bus
from shared.bus.session import open_bus
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
_SETTLE_S = 15.0
_SETTLE_WINDOW_S = 10.0
_HEALTH_REFRESH_S = 600.0  # the health agents' default --health-refresh-s


async def _wait(probe: Any, *, what: str, timeout_s: float, every_s: float = 1.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s}s")
        await asyncio.sleep(every_s)


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


async def _settle(bus: Bus, *, devices: int, timeout_s: float) -> float:
    """Seconds until the health agents write no faster than their refreshes (every record
    about once per `_HEALTH_REFRESH_S`): converged inventories and slices come before every
    health agent has written its first records and evaluated the inventory."""
    start = time.monotonic()
    at_rest = devices * _SETTLE_WINDOW_S / _HEALTH_REFRESH_S * 2 + 5
    before = await _health_seq(bus)
    while time.monotonic() - start < timeout_s:
        await asyncio.sleep(_SETTLE_WINDOW_S)
        now = await _health_seq(bus)
        if now - before <= at_rest:
            break
        before = now
    return round(time.monotonic() - start, 1)


async def _slice_nodes(kube: KubeClient) -> int:
    listed = await kube.list(resources.RESOURCE_SLICES)
    return len({item["spec"].get("nodeName") for item in listed["items"]})


def _cpu(fleet: Fleet) -> dict[str, float]:
    assert fleet.apiserver is not None
    assert fleet.apiserver.pid is not None
    return {
        "sim": sum(cpu_s(pid) for pid in fleet.worker_pids()),
        "emulator": cpu_s(fleet.apiserver.pid),
        "nats": sum(cpu_s(pid) for pid in fleet.nats_pids()),
    }


def _client_msgs(fleet: Fleet) -> Counter[str]:
    """Messages the agents' connections published, summed over the servers, per agent."""
    total: Counter[str] = Counter()
    for port in fleet.nats.monitor_ports:
        url = f"http://127.0.0.1:{port}/connz?limit=100000"
        with urllib.request.urlopen(url, timeout=10) as answer:
            connections = json.load(answer)["connections"] or []
        for connection in connections:
            name = connection.get("name", "")  # dra-<agent>/<node>
            if name.startswith("dra-"):
                total[name.split("/")[0].removeprefix("dra-")] += connection["in_msgs"]
    return total


def _api_requests(fleet: Fleet, *, clear: bool = False) -> list[dict[str, Any]]:
    method = "DELETE" if clear else "GET"
    request = urllib.request.Request(f"{fleet.api_url}/_emulator/requests", method=method)
    with urllib.request.urlopen(request, timeout=30, context=fleet.api_tls()) as answer:
        return list(json.load(answer).get("items", []))


def _start_requests(calls: list[dict[str, Any]], *, nodes: int) -> dict[str, float]:
    """What each node asked of the API server while the fleet converged."""
    watches = [c for c in calls if c["verb"] == "watch"]
    writes = [c for c in calls if c["verb"] in ("create", "update", "patch", "delete")]
    return {
        "scale_converge_api_requests_per_node": round((len(calls) - len(watches)) / nodes, 2),
        "scale_converge_api_writes_per_node": round(len(writes) / nodes, 2),
        "scale_api_watches_per_node": round(len(watches) / nodes, 2),
    }


async def _steady(fleet: Fleet, bus: Bus, *, seconds: float) -> dict[str, Any]:
    # The first health records and evaluations of a fresh start are not "at rest".
    settle_s = await _settle(bus, devices=fleet.nodes * DEVICES_PER_NODE, timeout_s=300.0)
    _api_requests(fleet, clear=True)
    async with _published(bus) as seen:
        msgs_before = _client_msgs(fleet)
        await asyncio.sleep(seconds)
        by_agent = _client_msgs(fleet)
    by_agent.subtract(msgs_before)
    msgs = sum(by_agent.values())
    calls = [r for r in _api_requests(fleet) if r["verb"] != "watch"]
    writes = [r for r in calls if r["verb"] in ("create", "update", "patch", "delete")]
    per_min = 60.0 / seconds / fleet.nodes
    return {
        "scale_steady_s": seconds,
        "scale_settle_s": settle_s,
        "scale_steady_api_writes_60s": round(len(writes) * 60.0 / seconds),
        "scale_steady_api_requests_per_node_min": round(len(calls) * per_min, 4),
        "scale_steady_nats_msgs_per_node_min": round(msgs * per_min, 3),
        **{
            f"scale_steady_nats_msgs_per_node_min_{agent}": round(count * per_min, 3)
            for agent, count in sorted(by_agent.items())
        },
        "scale_steady_watch_restarts": seen["$JS.API.CONSUMER.CREATE"],
        "scale_steady_subjects": dict(seen.most_common(8)),
    }


_HOG = "while True: pass"


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
async def _published(bus: Bus) -> AsyncIterator[Counter[str]]:
    """What clients publish (the open bus lets a `>` subscription see it), by subject family;
    the server's deliveries to inboxes aside."""
    seen: Counter[str] = Counter()

    async def count(msg: Msg) -> None:
        if not msg.subject.startswith("_INBOX."):
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
        async with _published(bus) as seen:
            msgs_before = _client_msgs(fleet)
            await asyncio.sleep(seconds)
            by_agent = _client_msgs(fleet)
    by_agent.subtract(msgs_before)
    per_min = 60.0 / seconds / fleet.nodes
    restarts = seen["$JS.API.CONSUMER.CREATE"]
    return {
        "scale_steady_busy_hogs": cores,
        "scale_steady_busy_nats_msgs_per_node_min": round(sum(by_agent.values()) * per_min, 3),
        **{
            f"scale_steady_busy_nats_msgs_per_node_min_{agent}": round(count * per_min, 3)
            for agent, count in sorted(by_agent.items())
        },
        "scale_steady_busy_watch_restarts": restarts,
        "scale_steady_busy_subjects": dict(seen.most_common(8)),
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
    expected = len(failed) - len(refused)
    with contextlib.suppress(TimeoutError):
        await _wait(
            lambda: _stream_has(bus, expected), what="storm alerts", timeout_s=60, every_s=0.2
        )
    elapsed = time.monotonic() - start
    stored = int((await bus.js.stream_info(bus.names.alerts_stream)).state.messages)
    return {
        "scale_fault_storm_faults": len(failed),
        "scale_fault_storm_commands_failed": len(refused),
        "scale_fault_storm_alerts_stored": stored,
        "scale_fault_storm_alerts_per_s": round(stored / elapsed, 1),
        "scale_fault_storm_tail_s": round(elapsed - STORM_WINDOW_S, 2),
    }, accepted


async def _stream_has(bus: Bus, count: int) -> bool:
    info = await bus.js.stream_info(bus.names.alerts_stream)
    return int(info.state.messages) >= count


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


async def _audit(bus: Bus) -> Counter[str]:
    """Every alert id the durable consumer is handed, counted."""
    subscription = await bus.js.pull_subscribe(
        bus.names.alerts_wildcard,
        durable=_AUDIT,
        stream=bus.names.alerts_stream,
        config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
    )
    seen: Counter[str] = Counter()
    while True:
        try:
            batch = await subscription.fetch(1000, timeout=3)
        except (nats.errors.TimeoutError, TimeoutError):
            return seen
        for msg in batch:
            alert = codec.decode_json(alert_pb2.Alert, msg.data, subject=msg.subject)
            key = alert.id if alert.id.startswith("burst-") else f"{alert.node}/{alert.device}"
            seen[f"{key}/{alert.status}"] += 1
            await msg.ack()


async def _dractl_health_all_s(fleet: Fleet) -> float:
    start = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.dractl",
        f"--nats-url={fleet.nats.url}",
        f"--driver-name={DRIVER}",
        "--nats-connect-timeout-s=10",
        *("-o", "json", "health", "--all-nodes"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    elapsed = time.monotonic() - start
    if process.returncode != 0:
        raise RuntimeError(f"dractl health --all-nodes: {err.decode()[-300:]}")
    counts = json.loads(out)["counts"]
    if process.returncode != 0 or counts["nodes"] != fleet.nodes:
        raise RuntimeError(f"dractl health --all-nodes: {counts} {err.decode()[-500:]}")
    return elapsed


async def measure(*, nodes: int, steady_s: float, workdir: Path) -> dict[str, Any]:
    fleet = Fleet(workdir, nodes)
    await fleet.start_services()
    figures: dict[str, Any] = {"scale_nodes": nodes, "scale_devices": nodes * DEVICES_PER_NODE}
    try:
        await fleet.register_nodes()
        async with (
            open_bus(fleet.nats_settings, timeout_s=10) as bus,
            contextlib.AsyncExitStack() as stack,
        ):
            kube = await KubeClient.connect(fleet.kube_settings)
            stack.push_async_callback(kube.close)
            _api_requests(fleet, clear=True)
            cpu_before, start = _cpu(fleet), time.monotonic()
            await fleet.start_workers()
            # The workers' CPU until now counts from their start: importing is part of it.
            cpu_before["sim"] = 0.0

            async def converged() -> bool:
                return await _inventories(bus) >= nodes and await _slice_nodes(kube) >= nodes

            await _wait(converged, what="convergence", timeout_s=max(120.0, nodes * 0.2))
            figures["scale_converge_s"] = round(time.monotonic() - start, 2)
            spent = {k: v - cpu_before[k] for k, v in _cpu(fleet).items()}
            figures |= {f"scale_converge_cpu_s_{k}": round(v, 1) for k, v in spent.items()}
            held = sum(rss_mb(pid) for pid in fleet.worker_pids()) - fleet.worker_base_rss_mb
            figures["scale_sim_rss_mb_per_node"] = round(held / nodes, 3)
            figures["scale_sim_workers"] = len(fleet.workers)
            figures |= _start_requests(_api_requests(fleet), nodes=nodes)
            await _phases(figures, fleet, bus, steady_s=steady_s)
    finally:
        await fleet.stop_services()
    return figures


async def _phases(figures: dict[str, Any], fleet: Fleet, bus: Bus, *, steady_s: float) -> None:
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
        seen = await _audit(bus)
        figures["scale_alerts_duplicated"] = sum(n - 1 for n in seen.values())
        figures["scale_alerts_lost"] = len(expected - set(seen))

    async def dractl() -> None:
        figures["scale_dractl_health_all_s"] = round(await _dractl_health_all_s(fleet), 2)

    async def steady() -> None:
        figures.update(await _steady(fleet, bus, seconds=steady_s))

    async def steady_busy() -> None:
        figures.update(await _steady_busy(fleet, bus, seconds=steady_s))

    for phase in (steady, steady_busy, storm, burst, audit, dractl):
        try:
            await phase()
        except Exception as exc:  # a failed phase is a figure too; the others still count
            errors.append(f"{phase.__name__}: {type(exc).__name__}: {exc}")
    mem = max(v["mem"] for v in fleet.varz())
    figures["scale_nats_server_rss_mb"] = round(mem / 2**20, 1)


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--steady-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    args = parser.parse_args()
    logging.configure(LogSettings(level="error", format="console"), service="scale")
    with tempfile.TemporaryDirectory(prefix="dra-scale-") as tmp:
        figures = asyncio.run(measure(nodes=args.nodes, steady_s=args.steady_s, workdir=Path(tmp)))
    figures["scale_bus"] = "open (no auth callout, no TLS), 3-server JetStream cluster, R3"
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update(figures)
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
