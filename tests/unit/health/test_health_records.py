"""DeviceHealth records from policy states, and back (what a restart starts from)."""

from __future__ import annotations

import pytest

from services.health.policy import DeviceState, Health, Taint
from services.health.recorder import state_from_record, to_record
from shared.pb.drasuite.v1 import health_pb2
from shared.vendors.parts.observation import Fault

DRIVER = "sim.dra-suite.io"
TAINT = Taint(key=f"{DRIVER}/xid", value="79", effect="NoSchedule")
FAULTY = DeviceState(
    device="gpu-0",
    health=Health.UNHEALTHY,
    since=12.5,
    fault=Fault(cause="xid", code="79", message="fell off the bus"),
    fault_since=12.5,
    taint=TAINT,
)


def record(state: DeviceState, taint: Taint | None = TAINT) -> health_pb2.DeviceHealth:
    return to_record(state, driver=DRIVER, node="node-a", pool="node-a", taint=taint)


def test_unhealthy_record_carries_the_fault_and_the_applied_taint():
    found = record(FAULTY)
    assert found.state == health_pb2.HEALTH_STATE_UNHEALTHY
    assert (found.cause, found.code, found.message) == ("xid", "79", "fell off the bus")
    assert found.taint == f"{DRIVER}/xid=79:NoSchedule"
    assert found.since_unix_ms == 12500
    assert (found.driver, found.node, found.pool, found.device) == (
        DRIVER,
        "node-a",
        "node-a",
        "gpu-0",
    )


def test_a_record_carries_every_wanted_taint_and_none_by_default():
    wanted = health_pb2.DeviceTaint(
        key=TAINT.key, value="79", effect="NoSchedule", time_added_unix_ms=12_500
    )
    found = to_record(
        FAULTY, driver=DRIVER, node="node-a", pool="node-a", taint=None, taints=[wanted]
    )
    assert list(found.taints) == [wanted]
    assert found.taint == ""  # wanted, but not applied (e.g. no DeviceTaintRules served)
    assert list(record(FAULTY).taints) == []


def test_record_without_an_applied_taint_has_an_empty_taint():
    assert record(FAULTY, taint=None).taint == ""


@pytest.mark.parametrize(
    ("state", "expected", "message"),
    [
        (
            DeviceState(device="gpu-0", health=Health.HEALTHY, since=1),
            health_pb2.HEALTH_STATE_HEALTHY,
            "",
        ),
        (
            DeviceState(device="gpu-0", health=Health.UNKNOWN, since=1),
            health_pb2.HEALTH_STATE_UNKNOWN,
            "device is not monitored",
        ),
    ],
    ids=["healthy", "unknown"],
)
def test_records_without_a_fault_have_no_cause(state, expected, message):
    found = record(state, taint=None)
    assert (found.state, found.cause, found.code, found.message) == (expected, "", "", message)


NOW = 1_800_000_000.0


def test_a_faulty_record_reads_back_as_the_state_it_came_from():
    assert state_from_record(record(FAULTY), now=NOW) == FAULTY


def test_a_healthy_record_reads_back_without_fault_or_taint():
    healthy = DeviceState(device="gpu-1", health=Health.HEALTHY, since=3.0)
    assert state_from_record(record(healthy, taint=None), now=NOW) == healthy


@pytest.mark.parametrize("since_ms", [0, -599, int(NOW * 1000) + 1, 2**63 - 1])
def test_a_since_that_is_not_a_past_time_counts_from_now(since_ms: int):
    """2**63 - 1 ms is no time at all, and once in float seconds and back it is past int64:
    an alert made from it failed the whole agent."""
    stored = record(FAULTY)
    stored.since_unix_ms = since_ms
    state = state_from_record(stored, now=NOW)
    assert (state.since, state.fault_since) == (NOW, NOW)
    assert state.fault == FAULTY.fault
