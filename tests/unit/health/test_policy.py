"""The health policy, step by step: faults, recovery, the hold time and flapping."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from services.health import policy
from services.health.policy import DeviceState, Health, PolicySettings, Taint, Verdict
from services.health.rules import default_rules
from shared.vendors.parts.observation import Fault, Observation

DRIVER = "sim.dra-suite.io"
XID = Fault(cause="xid", code="79", message="GPU has fallen off the bus")
XID_48 = Fault(cause="xid", code="48", message="double-bit ECC")
ECC = Fault(cause="ecc", code="uncorrectable")
XID_TAINT = Taint(key=f"{DRIVER}/xid", value="79", effect="NoSchedule")
UNMONITORED_TAINT = Taint(key=f"{DRIVER}/unmonitored", value="", effect="NoSchedule")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

HEALTHY = Observation(device="gpu-0")
UNKNOWN = Observation(device="gpu-0", unknown=True)


def faulty(fault: Fault) -> Observation:
    return Observation(device="gpu-0", fault=fault)


@dataclass(frozen=True)
class Expect:
    health: Health
    taint: Taint | None
    raised: int
    resolved: int
    applied: int
    removed: int


def run(steps: list[tuple[float, Observation]], *, hold: float = 0.0) -> list[Verdict]:
    settings = PolicySettings(driver=DRIVER, recovery_hold_s=hold)
    states: dict[str, DeviceState] = {}
    verdicts: list[Verdict] = []
    for now, observation in steps:
        evaluation = policy.evaluate([observation], states, now=now, settings=settings)
        states = evaluation.states()
        verdicts.extend(evaluation.verdicts)
    return verdicts


def summary(verdicts: list[Verdict]) -> Expect:
    last = verdicts[-1].state
    return Expect(
        health=last.health,
        taint=last.taint,
        raised=sum(v.raised for v in verdicts),
        resolved=sum(v.resolved is not None for v in verdicts),
        applied=sum(v.apply is not None for v in verdicts),
        removed=sum(v.remove is not None for v in verdicts),
    )


CASES = [
    ([(0, HEALTHY)], 0, Expect(Health.HEALTHY, None, 0, 0, 0, 0)),
    ([(0, HEALTHY), (1, faulty(XID))], 0, Expect(Health.UNHEALTHY, XID_TAINT, 1, 0, 1, 0)),
    ([(0, faulty(XID))], 0, Expect(Health.UNHEALTHY, XID_TAINT, 1, 0, 1, 0)),
    ([(0, faulty(XID)), (1, faulty(XID))], 0, Expect(Health.UNHEALTHY, XID_TAINT, 1, 0, 1, 0)),
    ([(0, faulty(XID)), (1, HEALTHY)], 0, Expect(Health.HEALTHY, None, 1, 1, 1, 1)),
    (
        [(0, faulty(XID)), (1, HEALTHY), (9, HEALTHY)],
        10,
        Expect(Health.UNHEALTHY, XID_TAINT, 1, 0, 1, 0),
    ),
    ([(0, faulty(XID)), (1, HEALTHY), (11, HEALTHY)], 10, Expect(Health.HEALTHY, None, 1, 1, 1, 1)),
    (
        [
            (0, faulty(XID)),
            (1, HEALTHY),
            (2, faulty(XID)),
            (3, HEALTHY),
            (4, faulty(XID)),
            (5, HEALTHY),
        ],
        10,
        Expect(Health.UNHEALTHY, XID_TAINT, 1, 0, 1, 0),
    ),
    (
        [(0, faulty(XID)), (1, HEALTHY), (2, faulty(XID)), (3, HEALTHY), (12, HEALTHY)],
        10,
        Expect(Health.UNHEALTHY, XID_TAINT, 1, 0, 1, 0),
    ),
    (
        [(0, faulty(XID)), (1, HEALTHY), (2, faulty(XID)), (3, HEALTHY), (13, HEALTHY)],
        10,
        Expect(Health.HEALTHY, None, 1, 1, 1, 1),
    ),
    (
        [(0, faulty(XID)), (1, faulty(ECC))],
        0,
        Expect(
            Health.UNHEALTHY,
            Taint(key=f"{DRIVER}/ecc", value="uncorrectable", effect="NoSchedule"),
            2,
            1,
            2,
            1,
        ),
    ),
    (
        [(0, faulty(XID)), (1, faulty(XID_48))],
        0,
        Expect(
            Health.UNHEALTHY,
            Taint(key=f"{DRIVER}/xid", value="48", effect="NoSchedule"),
            2,
            1,
            2,
            0,
        ),
    ),
    ([(0, faulty(XID)), (1, UNKNOWN)], 0, Expect(Health.UNKNOWN, XID_TAINT, 1, 0, 1, 0)),
    (
        [(0, faulty(XID)), (1, UNKNOWN), (2, faulty(XID))],
        0,
        Expect(Health.UNHEALTHY, XID_TAINT, 1, 0, 1, 0),
    ),
    ([(0, faulty(XID)), (1, UNKNOWN), (2, HEALTHY)], 0, Expect(Health.HEALTHY, None, 1, 1, 1, 1)),
    ([(0, UNKNOWN), (1, HEALTHY)], 0, Expect(Health.HEALTHY, None, 1, 1, 1, 1)),
    ([(0, HEALTHY), (1, UNKNOWN)], 0, Expect(Health.UNKNOWN, UNMONITORED_TAINT, 1, 0, 1, 0)),
    ([(0, UNKNOWN), (1, UNKNOWN)], 0, Expect(Health.UNKNOWN, UNMONITORED_TAINT, 1, 0, 1, 0)),
    (
        [(0, UNKNOWN), (1, faulty(XID))],
        0,
        Expect(Health.UNHEALTHY, XID_TAINT, 2, 1, 2, 1),
    ),
]
IDS = [
    "new healthy device is healthy without taint",
    "fault makes a healthy device unhealthy with a taint",
    "fault seen first makes the device unhealthy",
    "repeated fault raises once",
    "clear without hold makes the device healthy and removes the taint",
    "clear within the hold keeps the device unhealthy and tainted",
    "clear past the hold makes the device healthy",
    "flapping within the hold keeps one taint and one alert",
    "a fault within the hold restarts the hold",
    "the restarted hold ends the fault on time",
    "a fault with another cause replaces the taint",
    "a fault with another code updates the taint value",
    "unknown keeps the fault's taint",
    "the same fault after unknown raises no new alert",
    "healthy after unknown resolves the fault",
    "an unmonitored device recovers when it is seen healthy again",
    "a healthy device that goes unseen gets the unmonitored taint",
    "staying unmonitored raises once",
    "a fault seen after unmonitored replaces the unmonitored taint",
]


@pytest.mark.parametrize(("steps", "hold", "expect"), CASES, ids=IDS)
def test_policy_steps_end_in_the_expected_state(steps, hold, expect):
    assert summary(run(steps, hold=hold)) == expect


def test_fault_verdict_applies_the_taint_with_the_configured_effect():
    settings = PolicySettings(driver=DRIVER, rules=default_rules(effect="NoExecute"))
    verdict = policy.judge(faulty(XID), None, now=5.0, settings=settings)
    assert verdict.raised
    assert verdict.apply == Taint(key=f"{DRIVER}/xid", value="79", effect="NoExecute")
    assert verdict.state.since == 5.0
    assert verdict.state.fault_since == 5.0


def test_recovery_verdict_removes_the_taint_and_names_the_resolved_fault():
    settings = PolicySettings(driver=DRIVER)
    raised = policy.judge(faulty(XID), None, now=1.0, settings=settings)
    recovered = policy.judge(HEALTHY, raised.state, now=2.0, settings=settings)
    assert recovered.remove == XID_TAINT
    assert recovered.resolved == raised.state
    assert recovered.state == DeviceState(
        device="gpu-0", health=Health.HEALTHY, since=2.0, taint_changed=2.0
    )


def test_cause_change_removes_the_old_key_and_applies_the_new_one():
    verdicts = run([(0, faulty(XID)), (1, faulty(ECC))])
    assert verdicts[-1].remove == XID_TAINT
    assert verdicts[-1].apply is not None
    assert verdicts[-1].apply.key == f"{DRIVER}/ecc"
    assert verdicts[-1].resolved is not None
    assert verdicts[-1].resolved.fault == XID


def test_healthy_device_keeps_its_since_across_evaluations():
    verdicts = run([(0, HEALTHY), (5, HEALTHY)])
    assert verdicts[-1].state.since == 0


def test_devices_missing_from_the_observations_are_gone():
    settings = PolicySettings(driver=DRIVER)
    first = policy.evaluate(
        [faulty(XID), Observation(device="gpu-1")], {}, now=0, settings=settings
    )
    second = policy.evaluate(
        [Observation(device="gpu-1")], first.states(), now=1, settings=settings
    )
    assert [s.device for s in second.gone] == ["gpu-0"]
    assert second.gone[0].taint == XID_TAINT


@pytest.mark.parametrize(
    ("cause", "code", "key", "value"),
    [
        ("xid", "79", f"{DRIVER}/xid", "79"),
        ("XID error!", " 79/a ", f"{DRIVER}/XID-error", "79-a"),
        ("", "", f"{DRIVER}/fault", ""),
        ("---", "___", f"{DRIVER}/fault", ""),
        ("c" * 100, "v" * 100, f"{DRIVER}/{'c' * 63}", "v" * 63),
        ("npu.heartbeat_lost", "0x80E18402", f"{DRIVER}/npu.heartbeat_lost", "0x80E18402"),
    ],
    ids=["plain", "odd characters", "empty", "only separators", "too long", "dots and underscores"],
)
def test_taint_key_and_value_are_valid_label_syntax(cause, code, key, value):
    taint = policy.taint_for(Fault(cause=cause, code=code), PolicySettings(driver=DRIVER))
    assert (taint.key, taint.value) == (key, value)
    name = taint.key.partition("/")[2]
    assert len(name) <= 63
    assert _LABEL_NAME.match(name)
    assert len(taint.value) <= 63
    assert _LABEL_VALUE.match(taint.value)


def test_long_messages_are_cut_to_the_kubelet_limit():
    verdict = policy.judge(
        faulty(Fault(cause="xid", message="m" * 5000)),
        None,
        now=0,
        settings=PolicySettings(driver=DRIVER),
    )
    assert verdict.state.fault is not None
    assert len(verdict.state.fault.message) == policy.MESSAGE_MAX
    assert verdict.state.fault.message.endswith("...")


def test_next_deadline_is_the_end_of_the_earliest_hold():
    settings = PolicySettings(driver=DRIVER, recovery_hold_s=10)
    states = [
        DeviceState(device="a", health=Health.UNHEALTHY, since=0, healthy_since=3),
        DeviceState(device="b", health=Health.UNHEALTHY, since=0, healthy_since=1),
        DeviceState(device="c", health=Health.HEALTHY, since=0),
    ]
    assert policy.next_deadline(states, settings=settings) == 11
    assert policy.next_deadline(states[2:], settings=settings) is None


@pytest.mark.parametrize(
    ("text", "taint"),
    [
        ("d.io/xid=79:NoSchedule", Taint(key="d.io/xid", value="79", effect="NoSchedule")),
        ("d.io/xid=:None", Taint(key="d.io/xid", value="", effect="None")),
        ("", None),
        ("garbage", None),
    ],
    ids=["full", "empty value", "empty", "malformed"],
)
def test_taint_strings_parse_back(text, taint):
    assert Taint.parse(text) == taint
    if taint is not None:
        assert str(taint) == text
