"""Malformed NATS messages on every subject and KV key the health agent reads: the fault-control
and drain-control request subjects, the node's inventory, and (at start) its health records.

A bad request gets a clear `{"ok": false, "error": ...}` reply; a bad KV value is logged and
dropped. Either way the agent keeps running and handles the next good message.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from services.health.agent import HealthAgent
from shared.bus import codec, origin, streams
from shared.errors import BusUnavailableError
from shared.pb.drasuite.v1 import alert_pb2, health_pb2, inventory_pb2
from shared.vendors.sim.monitor import SimMonitor
from tests.integration.fuzz.fuzzing import Logs, fuzz_settings, garbage_bytes, until
from tests.integration.health.conftest import HealthHarness

pytestmark = pytest.mark.integration

DRIVER, NODE = HealthHarness.DRIVER, HealthHarness.NODE
OVERSIZED = 1_000_000  # below NATS's default max_payload (1 MiB), with room for headers
# The largest value the health bucket takes (its max_msg_size, less room for headers).
OVERSIZED_RECORD = streams.limits_of("dra_health").max_msg_size - 512
NOISE = b"\xff\xfe\x00garbage" + bytes(range(256))  # 0xff: field 31, wire type 7: never valid


def _inventory(**fields: Any) -> inventory_pb2.Inventory:
    values: dict[str, Any] = {"driver": DRIVER, "node": NODE, "pool": NODE, "backend": "sim"}
    return inventory_pb2.Inventory(**{**values, **fields})


def _record(device: str, **fields: Any) -> health_pb2.DeviceHealth:
    values: dict[str, Any] = {"driver": DRIVER, "node": NODE, "pool": NODE, "device": device}
    return health_pb2.DeviceHealth(**{**values, **fields})


FAULT_GARBAGE = [
    ("random bytes", NOISE, "malformed fault command"),
    ("empty", b"", "device is required"),
    ("inventory", codec.encode(_inventory(devices=[{"name": "gpu-0"}])), "wrong wire type"),
    ("health record", codec.encode(_record("gpu-0", state=2)), "wrong wire type"),
    ("drain request", json.dumps({"device": "gpu-0"}).encode(), "malformed fault command"),
    ("unknown device", codec.encode(health_pb2.FaultCommand(device="gpu-9")), "unknown device"),
    ("oversized", b"\xff" + os.urandom(OVERSIZED), "malformed fault command"),
]
DRAIN_GARBAGE = [
    ("not UTF-8", NOISE, "malformed drain request"),
    ("empty", b"", "malformed drain request"),
    ("a list", b"[]", "expected an object"),
    ("null", b"null", "expected an object"),
    ("device not a string", b'{"device": 5}', "device (string)"),
    ("drain not a bool", b'{"device": "gpu-0", "drain": "yes"}', "drain (bool)"),
    ("nested too deep", b"[" * 100_000, "malformed drain request"),
    ("fault command", codec.encode(health_pb2.FaultCommand(device="gpu-0")), "malformed drain"),
    ("unknown device", b'{"device": "gpu-9"}', "unknown device"),
    ("oversized", b"\xff" + os.urandom(OVERSIZED), "malformed drain request"),
]
INVENTORY_GARBAGE = [
    ("random bytes", NOISE),
    ("empty", b""),
    ("health record", codec.encode(_record("gpu-0", state=1))),
    ("fault command", codec.encode(health_pb2.FaultCommand(device="gpu-0", clear=True))),
    ("alert as JSON", codec.encode_json(alert_pb2.Alert(id="a-1", driver=DRIVER, node=NODE))),
    ("other driver", codec.encode(_inventory(driver="other.example.com"))),
    ("other node", codec.encode(_inventory(node="node-b", devices=[{"name": "gpu-0"}]))),
    ("oversized", b"\xff" + os.urandom(OVERSIZED)),
]


class Running:
    """The health agent, and the good messages that prove it still listens."""

    def __init__(self, health: HealthHarness, agent: HealthAgent) -> None:
        self.health = health
        self.agent = agent
        self.bus = health.bus
        self.faulty = False
        self.drained = False
        self.inventories = [HealthHarness.DEVICES, (*HealthHarness.DEVICES, "gpu-3")]

    async def request(self, subject: str, data: bytes) -> dict[str, Any]:
        reply = await self.bus.request(subject, data, timeout_s=5)
        answer: dict[str, Any] = json.loads(reply.data)
        return answer

    async def fault(self, data: bytes) -> dict[str, Any]:
        return await self.request(self.bus.names.fault_control(DRIVER, NODE), data)

    async def drain(self, data: bytes) -> dict[str, Any]:
        return await self.request(self.bus.names.drain_control(DRIVER, NODE), data)

    async def next_fault(self) -> None:
        """Inject (or clear) a fault on gpu-1, and see the record follow."""
        self.faulty = not self.faulty
        command = health_pb2.FaultCommand(device="gpu-1", clear=not self.faulty, cause="xid")
        assert await self.fault(codec.encode(command)) == {"ok": True}
        state = HealthHarness.UNHEALTHY if self.faulty else HealthHarness.HEALTHY
        await self.health.eventually(self.health.state_is("gpu-1", state))

    async def next_drain(self) -> None:
        self.drained = not self.drained
        request = {"device": "gpu-2", "drain": self.drained, "reason": "fuzz"}
        answer = await self.drain(json.dumps(request).encode())
        assert (answer["ok"], answer["drained"]) == (True, self.drained)

    def devices(self) -> tuple[str, ...]:
        assert isinstance(self.agent.monitor, SimMonitor)
        view = self.agent.monitor.view()
        return tuple(o.device for o in view.devices) if view is not None else ()

    async def next_inventory(self) -> None:
        self.inventories.reverse()
        devices = self.inventories[0]
        await self.health.put_inventory(devices)
        await until(lambda: self.devices() == devices, what=f"devices {devices}")
        await until(lambda: tuple(sorted(self.agent.evaluator.states)) == devices)


@pytest.fixture
async def running(health: HealthHarness) -> AsyncIterator[Running]:
    health.create_node()
    await health.put_inventory()
    async with health.running() as agent:
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        await health.command(health.fault("gpu-0", clear=True))  # waits for the subscription
        yield Running(health, agent)


async def test_bad_fault_commands_get_error_replies(running: Running):
    for label, data, error in FAULT_GARBAGE:
        answer = await running.fault(data)
        assert answer["ok"] is False, label
        assert error in answer["error"], (label, answer)
        await running.next_fault()


async def test_bad_drain_requests_get_error_replies(running: Running):
    for label, data, error in DRAIN_GARBAGE:
        answer = await running.drain(data)
        assert answer["ok"] is False, label
        assert error in answer["error"], (label, answer)
        await running.next_drain()
    # A reason of any length is cut, not refused.
    answer = await running.drain(
        json.dumps({"device": "gpu-0", "reason": "r" * OVERSIZED}).encode()
    )
    assert answer == {"ok": True, "device": "gpu-0", "drained": True}


async def test_garbage_published_without_a_reply_subject_is_survived(running: Running):
    for subject in (
        running.bus.names.fault_control(DRIVER, NODE),
        running.bus.names.drain_control(DRIVER, NODE),
    ):
        for data in (NOISE, b"", b"{}"):
            await running.bus.nc.publish(subject, data)
    await running.next_fault()
    await running.next_drain()


async def test_bad_inventories_are_logged_and_dropped(running: Running, logs: Logs):
    for label, data in INVENTORY_GARBAGE:
        before, mark = running.devices(), logs.mark()
        key = running.bus.names.inventory_key(DRIVER, NODE)
        await running.bus.kv_put(running.bus.names.inventory_bucket, key, data)
        # Two readers: the partition topology and the sim monitor's device list.
        await until(lambda: len(logs.since(mark, "inventory_malformed")) == 2, what=label)  # noqa: B023
        assert all(e["error"] for e in logs.since(mark, "inventory_malformed")), label
        assert running.devices() == before, label
        await running.next_inventory()


@fuzz_settings(max_examples=80)
@given(
    data=garbage_bytes(max_size=2048),
    target=st.sampled_from(["fault", "drain"]),
)
@example(data=b'{"error": {"code": 503}}', target="fault")
async def test_random_requests_get_error_replies(running: Running, data: bytes, target: str):
    if origin.is_jetstream_reply(reply="", headers=None, data=data):
        # What looks like JetStream's own answer (which a node could have the server redirect
        # onto this subject) is dropped unanswered, never acted on; the agent serves on.
        with pytest.raises(BusUnavailableError):
            await (running.fault(data) if target == "fault" else running.drain(data))
        await (running.next_fault() if target == "fault" else running.next_drain())
        return
    if target == "fault":
        answer = await running.fault(data)
        assert answer["ok"] is False
        assert answer["error"]
        await running.next_fault()
    else:
        answer = await running.drain(data)
        assert answer["ok"] is False
        assert answer["error"]
        await running.next_drain()


def _int64() -> st.SearchStrategy[int]:
    return st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _garbage_records() -> st.SearchStrategy[health_pb2.DeviceHealth]:
    """Records that decode but that no health agent wrote: any state, time, cause or taint."""
    text = st.text(max_size=40)
    taints = st.builds(
        health_pb2.DeviceTaint, key=text, value=text, effect=text, time_added_unix_ms=_int64()
    )
    return st.builds(
        health_pb2.DeviceHealth,
        driver=st.just(DRIVER),
        node=st.just(NODE),
        pool=text,
        device=st.sampled_from(["gpu-0", "gpu-1", "gpu-9", ""]),
        state=st.integers(min_value=-3, max_value=9),
        cause=text,
        code=text,
        message=text,
        since_unix_ms=_int64(),
        updated_unix_ms=_int64(),
        taint=text | st.just(f"{DRIVER}/xid=79:NoSchedule"),
        taints=st.lists(taints, max_size=3),
    )


def _gone(health: HealthHarness, device: str) -> Callable[[], Awaitable[bool]]:
    """The device's key holds nothing: read raw, since until the agent deletes it the key may
    still hold the undecodable garbage planted there."""
    bus = health.bus

    async def check() -> bool:
        key = bus.names.health_key(DRIVER, NODE, device)
        return await bus.kv_get(bus.names.health_bucket, key) is None

    return check


async def _starts_over_garbage(health: HealthHarness, records: dict[str, bytes]) -> None:
    """Leave `records` in the health KV, start the agent: it comes up, keeps running, writes
    the true health of its devices and deletes the keys of devices it does not have."""
    bucket = health.bus.names.health_bucket
    for device, data in records.items():
        await health.bus.kv_put(bucket, health.bus.names.health_key(DRIVER, NODE, device), data)
    async with health.running():
        for device in HealthHarness.DEVICES:
            await health.eventually(health.state_is(device, health.HEALTHY))
        for device in set(records) - set(HealthHarness.DEVICES):
            await health.eventually(_gone(health, device))
        assert await health.command(health.fault("gpu-0", cause="xid")) == {"ok": True}
        await health.eventually(health.state_is("gpu-0", health.UNHEALTHY))
        assert await health.command(health.fault("gpu-0", clear=True)) == {"ok": True}
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))


async def test_garbage_health_records_at_start_are_replaced(health: HealthHarness):
    health.create_node()
    await health.put_inventory()
    await _starts_over_garbage(
        health,
        {
            "gpu-0": NOISE,
            "gpu-1": codec.encode(_inventory(devices=[{"name": "gpu-1"}])),
            "gpu-2": b"",
            "gpu-9": codec.encode(_record("gpu-9", state=2, cause="xid", taint="x=y:NoSchedule")),
            "zz": b"\xff" + os.urandom(OVERSIZED_RECORD),
        },
    )


async def test_records_with_times_past_int64_do_not_stop_the_agent(health: HealthHarness):
    """Found by the fuzz below: a fault carried over from a record whose `since` is the largest
    int64 made a RESOLVED alert time past int64, and the agent failed."""
    health.create_node()
    await health.put_inventory()
    end_of_int64 = 2**63 - 1
    taint = health_pb2.DeviceTaint(
        key=f"{DRIVER}/xid", value="79", effect="NoSchedule", time_added_unix_ms=end_of_int64
    )
    await _starts_over_garbage(
        health,
        {
            device: codec.encode(
                _record(device, state=2, cause="xid", since_unix_ms=end_of_int64, taints=[taint])
            )
            for device in ("gpu-0", "gpu-1")
        },
    )


@fuzz_settings(max_examples=20)
@given(records=st.dictionaries(st.sampled_from(["gpu-0", "gpu-1", "gpu-9"]), _garbage_records()))
async def test_health_records_no_agent_wrote_do_not_stop_the_next_start(
    health: HealthHarness, records: dict[str, health_pb2.DeviceHealth]
):
    if not health.kube.objects("nodes"):
        health.create_node()
        await health.put_inventory()
    await _starts_over_garbage(health, {d: codec.encode(r) for d, r in records.items()})
