"""The node on a 3-server JetStream cluster (`--nats-cluster 3`): each server is killed with
SIGKILL in turn, the alert stream's leader first, then the health bucket's, while faults are
raised and resolved and claims are prepared. Every prepare succeeds, every raised and resolved
alert reaches a durable consumer exactly once, and the health KV, the taints and the
kubelet's health stream end on exactly the faults still injected; the inventory KV matches
the slices. Buckets and the stream were created with 3 replicas."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
import structlog
from nats.js import api

from devcluster.flow import FlowError
from devcluster.natscluster import NATSCluster
from shared.bus import codec, streams
from shared.bus.connection import Bus
from shared.bus.subjects import Names
from shared.config import NATSSettings
from shared.errors import BusUnavailableError
from shared.pb.drasuite.v1 import alert_pb2
from tests.reliability.harness import ReliabilityNode, until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(150)]

SERVERS = 3
FAULTS = ("gpu-0", "gpu-1", "gpu-2")
AUDIT = "fleet-audit"
"""The durable consumer that stands for the alert pipeline (pager, ticketing)."""


async def _inject(node: ReliabilityNode, device: str, *, clear: bool = False) -> None:
    """A fault command, retried while the health agent's connection moves to a live server
    (a repeat is harmless: the device is already in that state)."""

    async def attempt() -> bool:
        try:
            await node.inject(device, clear=clear)
        except (BusUnavailableError, FlowError, TimeoutError):
            return False
        return True

    await until(attempt, what=f"fault command for {device} answered", timeout_s=20)


async def _has_stream(node: ReliabilityNode) -> bool:
    try:
        return node.bus.names.alerts_stream in await _replicas(node)
    except nats.errors.TimeoutError:
        return False  # a JetStream API call of a loaded cluster timed out: ask again


async def _all_replicas(node: ReliabilityNode) -> dict[str, int] | None:
    try:
        return await _replicas(node)
    except nats.errors.TimeoutError:
        return None


async def _converged(node: ReliabilityNode) -> set[str]:
    """`wait_health_converged`, read again where a read found no live replica for a moment
    (the harness's own reads are not retried)."""
    for _ in range(10):
        try:
            return await node.wait_health_converged()
        except BusUnavailableError:
            await asyncio.sleep(0.5)
    return await node.wait_health_converged()


def _cluster(node: ReliabilityNode) -> NATSCluster:
    assert isinstance(node.stack.nats, NATSCluster)
    return node.stack.nats


async def _leader(node: ReliabilityNode, stream: str) -> int:
    info = await node.bus.js.stream_info(stream)
    assert info.cluster is not None
    assert info.cluster.leader is not None
    return int(info.cluster.leader.removeprefix("n"))


async def _kill_order(node: ReliabilityNode) -> list[int]:
    """The alert stream's leader, then the health bucket's, then the rest."""
    names = node.bus.names
    order = [await _leader(node, names.alerts_stream)]
    health = await _leader(node, names.kv_stream(names.health_bucket))
    order += [health] if health not in order else []
    return order + [i for i in range(SERVERS) if i not in order]


async def _audited(node: ReliabilityNode) -> list[alert_pb2.Alert]:
    """Everything the durable consumer is handed, each acknowledged."""
    names = node.bus.names
    subscription = await node.bus.js.pull_subscribe(
        names.alerts_wildcard, durable=AUDIT, stream=names.alerts_stream
    )
    found: list[alert_pb2.Alert] = []
    while True:
        try:
            batch = await subscription.fetch(100, timeout=2)
        except (nats.errors.TimeoutError, TimeoutError):
            return found
        for msg in batch:
            found.append(codec.decode_json(alert_pb2.Alert, msg.data, subject=msg.subject))
            await msg.ack()


def _counts(alerts: list[alert_pb2.Alert]) -> Counter[tuple[str, str]]:
    return Counter(
        (a.device, alert_pb2.AlertStatus.Name(a.status).removeprefix("ALERT_STATUS_"))
        for a in alerts
    )


async def _replicas(node: ReliabilityNode) -> dict[str, int]:
    names = node.bus.names
    streams = [names.kv_stream(b) for b in names.buckets] + [names.alerts_stream]
    found = {}
    for stream in streams:
        try:
            found[stream] = (await node.bus.js.stream_info(stream)).config.num_replicas or 1
        except nats.js.errors.NotFoundError:
            continue
    return found


# A killed server takes the R1 consumers of the watches it hosted while the agents' connections
# stay up; a short heartbeat has those watches restart within 3 s instead of 60.
@pytest.mark.parametrize(
    "node", [{"nats_cluster": SERVERS, "nats_watch_heartbeat_s": 1.0}], indirect=True
)
async def test_each_server_killed_in_turn_loses_no_alert_taint_or_prepare(node: ReliabilityNode):
    cluster = _cluster(node)
    pids = node.stack.agent_pids()
    await _inject(node, FAULTS[0])  # the alert stream exists from here on
    names = node.bus.names
    await until(lambda: _has_stream(node), what="the alert stream", timeout_s=10)
    await node.bus.js.add_consumer(
        names.alerts_stream,
        config=api.ConsumerConfig(durable_name=AUDIT, ack_policy=api.AckPolicy.EXPLICIT),
    )
    replicas = await until(lambda: _all_replicas(node), what="the streams' replicas")
    assert set(replicas.values()) == {SERVERS}, replicas
    assert names.alerts_stream in replicas

    want: Counter[tuple[str, str]] = Counter({(FAULTS[0], "RAISED"): 1})
    for round_, server in enumerate(await _kill_order(node)):
        await asyncio.to_thread(cluster.kill, server)
        # While the server is dead: the last fault resolves, the next is raised, a claim is
        # prepared.
        await _inject(node, FAULTS[round_], clear=True)
        want[(FAULTS[round_], "RESOLVED")] += 1
        if round_ + 1 < len(FAULTS):
            await _inject(node, FAULTS[round_ + 1])
            want[(FAULTS[round_ + 1], "RAISED")] += 1
        claim = await node.allocated_claim([f"npu-{round_}"])
        answer = (await node.prepare([claim]))[claim.uid]
        assert answer.error == "", f"prepare with n{server} dead: {answer.error}"
        assert await _converged(node) == node.injected
        await asyncio.to_thread(cluster.restart, server)

    assert node.stack.agent_pids() == pids
    await node.wait_slices_match_profile()
    assert await node.inventory_devices() == set(await node.slice_devices())
    await until(lambda: _all_alerts(node, want), what=f"alerts {dict(want)}", timeout_s=20)
    audited = await _audited(node)
    assert _counts(audited) == want
    assert len({a.id for a in audited}) == len(audited)
    assert await _converged(node) == set()


async def _all_alerts(node: ReliabilityNode, want: Counter[tuple[str, str]]) -> bool:
    return await node.alert_counts() == want


async def _bus(url: str, replicas: int) -> tuple[Bus, asyncio.Task[None]]:
    bus = Bus(NATSSettings(url=url, replicas=replicas), name="upgrade")
    task = asyncio.create_task(bus.run())
    await asyncio.wait_for(bus.connected.wait(), 10)
    return bus, task


async def _stop(bus: Bus, task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await bus.close()


async def _once_answering(publish: Callable[[], Awaitable[object]]) -> None:
    """Publish to a stream just created: on a loaded machine its new leader may not take
    publishes yet (no responders), for a moment."""
    for _ in range(100):
        try:
            await publish()
            return
        except nats.js.errors.NoStreamResponseError:
            await asyncio.sleep(0.2)
    await publish()


async def test_one_replica_buckets_and_stream_grow_to_three_in_place_keeping_their_data(
    short_tmp: Path,
):
    with NATSCluster(short_tmp / "nats", size=SERVERS) as cluster:
        # As an older release left them: one replica, nats-py's KV create (no consumer limit
        # set, so the server's 1,000 applies), a stream without one either.
        client = await nats.connect(cluster.url.split(","))
        names = Names("")
        # A fresh cluster elects its stream leaders while a loaded machine runs other tests.
        js = client.jetstream(timeout=30)
        kv = await js.create_key_value(bucket=names.inventory_bucket)
        await _once_answering(lambda: kv.put("d.n", b"inventory"))
        await js.add_stream(
            api.StreamConfig(
                name="ALERTS", subjects=["dra.alerts.>"], max_age=3600.0, duplicate_window=120.0
            )
        )
        await _once_answering(
            lambda: js.publish("dra.alerts.d.n", b"alert", headers={"Nats-Msg-Id": "a-1"})
        )
        await client.close()

        new, task = await _bus(cluster.url, SERVERS)
        with structlog.testing.capture_logs() as events:
            assert await new.kv_get(names.inventory_bucket, "d.n") == b"inventory"
            await new.ensure_stream(**_ALERTS)
        for stream in (names.kv_stream(names.inventory_bucket), "ALERTS"):
            info = await new.js.stream_info(stream)
            assert info.config.num_replicas == SERVERS
            assert info.state.messages == 1
            assert info.config.max_consumers == streams.MAX_CONSUMERS
        updated = {e["stream"] for e in events if e["event"] == "stream_updated"}
        assert updated == {names.kv_stream(names.inventory_bucket), "ALERTS"}
        await _stop(new, task)


async def test_where_nats_refuses_the_change_the_agent_logs_the_command_and_goes_on(
    nats_server_factory: Any,
):
    """One server cannot hold 3 replicas: the update is refused, the stream stays as it is,
    and the log line says what to run (once the cluster is there)."""
    server = nats_server_factory()
    old, task = await _bus(server.url, 1)
    await old.ensure_stream(**_ALERTS)
    await _stop(old, task)
    new, task = await _bus(server.url, SERVERS)
    with structlog.testing.capture_logs() as events:
        await new.ensure_stream(**_ALERTS)
        await new.ensure_stream(**_ALERTS)
    (differ,) = [e for e in events if e["event"] == "stream_settings_differ"]
    assert differ["run"] == "nats stream edit ALERTS --replicas 3 --force"
    assert differ["error"]
    assert (await new.js.stream_info("ALERTS")).config.num_replicas == 1
    await new.publish_js("dra.alerts.d.n", b"alert", msg_id="a-2")
    await _stop(new, task)


_ALERTS: dict[str, Any] = {
    "name": "ALERTS",
    "subjects": ["dra.alerts.>"],
    "max_age_s": 3600.0,
    "duplicate_window_s": 120.0,
}
