"""HealthBoard and the stream's snapshots: full device lists, Unknown default, resend cadence."""

from __future__ import annotations

import asyncio

import pytest

from services.allocation.dra.health_stream import snapshots
from services.allocation.node_view import health_board
from services.allocation.node_view.health_board import Health, HealthBoard
from shared.pb.drasuite.v1 import health_pb2

NOW = 1_700_000_000.0


def _board(*devices: str) -> HealthBoard:
    board = HealthBoard(pool="node-a", clock=lambda: NOW)
    board.set_devices(devices)
    return board


def _record(
    state: health_pb2.HealthState.ValueType, message: str = "", updated_ms: int = 1_600_000_000_000
) -> health_pb2.DeviceHealth:
    return health_pb2.DeviceHealth(
        device="npu-0", state=state, message=message, updated_unix_ms=updated_ms
    )


@pytest.mark.parametrize(
    ("state", "health"),
    [
        (health_pb2.HEALTH_STATE_HEALTHY, Health.HEALTHY),
        (health_pb2.HEALTH_STATE_UNHEALTHY, Health.UNHEALTHY),
        (health_pb2.HEALTH_STATE_UNKNOWN, Health.UNKNOWN),
        (health_pb2.HEALTH_STATE_UNSPECIFIED, Health.UNKNOWN),
    ],
    ids=["healthy", "unhealthy", "unknown", "unspecified"],
)
def test_record_states_map_to_kubelet_health(state, health):
    board = _board("npu-0")
    board.put("npu-0", _record(state))
    [view] = board.snapshot()
    assert (view.health, view.updated_s) == (health, 1_600_000_000)


def test_every_inventory_device_is_listed_and_unrecorded_ones_are_unknown():
    board = _board("npu-0", "npu-1")
    board.put("npu-0", _record(health_pb2.HEALTH_STATE_HEALTHY))
    board.put("gpu-9", _record(health_pb2.HEALTH_STATE_UNHEALTHY))  # not in the inventory
    views = board.snapshot()
    assert [(v.pool, v.device, v.health) for v in views] == [
        ("node-a", "npu-0", Health.HEALTHY),
        ("node-a", "npu-1", Health.UNKNOWN),
    ]
    assert views[1].updated_s == int(NOW)


@pytest.mark.parametrize(
    ("length", "expected"),
    [(1024, 1024), (1025, 1024), (3000, 1024), (10, 10)],
    ids=["at-limit", "one-over", "far-over", "short"],
)
def test_messages_are_cut_to_the_kubelets_limit(length, expected):
    message = health_board.truncate_message("x" * length)
    assert len(message) == expected
    if length > 1024:
        assert message.endswith("...")
        assert message[:1021] == "x" * 1021


def test_retain_drops_records_of_deleted_keys():
    board = _board("npu-0", "npu-1")
    board.put("npu-0", _record(health_pb2.HEALTH_STATE_HEALTHY))
    board.put("npu-1", _record(health_pb2.HEALTH_STATE_HEALTHY))
    board.retain({"npu-1"})
    assert [v.health for v in board.snapshot()] == [Health.UNKNOWN, Health.HEALTHY]


def test_changes_set_the_event_taken_before_them_and_repeats_do_not():
    board = _board("npu-0")
    before = board.changed()
    board.put("npu-0", _record(health_pb2.HEALTH_STATE_HEALTHY))
    assert before.is_set()
    after = board.changed()
    board.put("npu-0", _record(health_pb2.HEALTH_STATE_HEALTHY))
    board.set_devices(["npu-0"])
    assert not after.is_set()


async def test_snapshots_come_at_once_on_change_and_on_the_resend_period():
    board = _board("npu-0")
    stream = snapshots(board, resend_s=0.2)
    loop = asyncio.get_running_loop()
    first = await anext(stream)
    assert first[0].health is Health.UNKNOWN
    started = loop.time()
    board.put("npu-0", _record(health_pb2.HEALTH_STATE_UNHEALTHY, "xid 79"))
    changed = await anext(stream)
    assert (changed[0].health, changed[0].message) == (Health.UNHEALTHY, "xid 79")
    assert loop.time() - started < 0.1
    resent = await anext(stream)
    assert resent == changed
    assert loop.time() - started >= 0.19
    board.close()
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
