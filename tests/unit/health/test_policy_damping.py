"""The policy's classes and damping: effects per class, ignored XIDs, the flap window."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.health import policy, rules
from services.health.policy import DeviceState, Health, PolicySettings, Taint, Verdict
from services.health.rules import FaultRules
from shared.vendors.parts.observation import Fault, Observation

DRIVER = "sim.dra-suite.io"
XID_79 = Fault(cause="xid", code="79")
XID_48 = Fault(cause="xid", code="48")
XID_13 = Fault(cause="xid", code="13")
XID_94 = Fault(cause="xid", code="94")
SUBHEALTH = Fault(cause="npu-subhealth", code="81A3880C")
HEALTHY = Observation(device="gpu-0")


def faulty(fault: Fault) -> Observation:
    return Observation(device="gpu-0", fault=fault)


def run(
    steps: list[tuple[float, Observation]],
    *,
    hold: float = 0.0,
    window: float = 0.0,
    fault_rules: FaultRules | None = None,
) -> list[Verdict]:
    settings = PolicySettings(
        driver=DRIVER,
        recovery_hold_s=hold,
        flap_window_s=window,
        rules=fault_rules or rules.default_rules(),
    )
    states: dict[str, DeviceState] = {}
    verdicts: list[Verdict] = []
    for now, observation in steps:
        evaluation = policy.evaluate([observation], states, now=now, settings=settings)
        states = evaluation.states()
        verdicts.extend(evaluation.verdicts)
    return verdicts


@dataclass(frozen=True)
class Outcome:
    health: Health
    taint: str
    raised: int
    resolved: int
    writes: int
    """Taint changes (applies + removes): DeviceTaintRule writes."""


def outcome(verdicts: list[Verdict]) -> Outcome:
    last = verdicts[-1].state
    return Outcome(
        health=last.health,
        taint=str(last.taint) if last.taint else "",
        raised=sum(v.raised for v in verdicts),
        resolved=sum(v.resolved is not None for v in verdicts),
        writes=sum((v.apply is not None) + (v.remove is not None) for v in verdicts),
    )


XID_79_TAINT = f"{DRIVER}/xid=79:NoSchedule"
XID_48_TAINT = f"{DRIVER}/xid=48:NoSchedule"

CASES = [
    ([(0, faulty(XID_13))], {}, Outcome(Health.HEALTHY, "", 0, 0, 0)),
    ([(0, faulty(XID_79)), (1, faulty(XID_13))], {}, Outcome(Health.HEALTHY, "", 1, 1, 2)),
    (
        [(0, faulty(XID_94))],
        {},
        Outcome(Health.UNHEALTHY, f"{DRIVER}/xid=94:NoSchedule", 1, 0, 1),
    ),
    (
        [(0, faulty(SUBHEALTH))],
        {},
        Outcome(Health.HEALTHY, f"{DRIVER}/npu-subhealth=81A3880C:None", 1, 0, 1),
    ),
    (
        [(0, faulty(SUBHEALTH)), (1, HEALTHY)],
        {},
        Outcome(Health.HEALTHY, "", 1, 1, 2),
    ),
    (
        [(0, faulty(XID_79)), (1, faulty(XID_48))],
        {"window": 10},
        Outcome(Health.UNHEALTHY, XID_79_TAINT, 1, 0, 1),
    ),
    (
        [(0, faulty(XID_79)), (1, faulty(XID_48)), (10, faulty(XID_48))],
        {"window": 10},
        Outcome(Health.UNHEALTHY, XID_48_TAINT, 2, 1, 2),
    ),
    (
        [(0, faulty(XID_79)), (1, HEALTHY), (3, HEALTHY)],
        {"hold": 2, "window": 10},
        Outcome(Health.UNHEALTHY, XID_79_TAINT, 1, 0, 1),
    ),
    (
        [(0, faulty(XID_79)), (1, HEALTHY), (10, HEALTHY)],
        {"hold": 2, "window": 10},
        Outcome(Health.HEALTHY, "", 1, 1, 2),
    ),
    (
        [(0, faulty(XID_79)), (1, HEALTHY), (10, HEALTHY), (11, faulty(XID_79))],
        {"window": 10},
        Outcome(Health.UNHEALTHY, XID_79_TAINT, 2, 1, 3),
    ),
    (
        [(t / 10, faulty(XID_79) if t % 2 == 0 else HEALTHY) for t in range(300)]
        + [(29.9 + 5.0, HEALTHY)],
        {"hold": 5, "window": 5},
        Outcome(Health.HEALTHY, "", 1, 1, 2),
    ),
    (
        [(t / 10, faulty(XID_79) if t % 2 == 0 else HEALTHY) for t in range(300)],
        {"hold": 5, "window": 5},
        Outcome(Health.UNHEALTHY, XID_79_TAINT, 1, 0, 1),
    ),
]
IDS = [
    "an application xid is no fault",
    "an application xid after a fatal one clears it",
    "a transient xid taints with the transient effect",
    "an informational fault keeps the device healthy with a None taint",
    "an informational fault resolves",
    "a code change within the flap window waits",
    "a code change happens once the flap window has passed",
    "recovery waits for the flap window even after the hold",
    "recovery happens after both the hold and the window",
    "a new taint right after a removal is never delayed",
    "flapping every 100 ms for 30 s writes two taint changes with the default damping",
    "a device still flapping keeps its one taint",
]


@pytest.mark.parametrize(("steps", "damping", "expected"), CASES, ids=IDS)
def test_damped_policy_steps_end_in_the_expected_state(steps, damping, expected):
    assert outcome(run(steps, **damping)) == expected


@pytest.mark.parametrize(
    ("effect", "expected"),
    [("NoSchedule", "NoSchedule"), ("NoExecute", "NoExecute"), ("None", "None")],
    ids=["no schedule", "no execute opt-in", "none"],
)
def test_the_fatal_class_effect_is_the_taint_effect(effect, expected):
    verdict = run([(0, faulty(XID_79))], fault_rules=rules.default_rules(effect=effect))[0]
    assert verdict.apply == Taint(key=f"{DRIVER}/xid", value="79", effect=expected)


def test_a_deferred_change_sets_a_deadline_at_the_end_of_the_window():
    settings = PolicySettings(driver=DRIVER, flap_window_s=10)
    first = policy.judge(faulty(XID_79), None, now=0, settings=settings)
    second = policy.judge(faulty(XID_48), first.state, now=1, settings=settings)
    assert second.state.deferred
    assert policy.next_deadline([second.state], settings=settings) == 10


def test_the_recovery_deadline_is_the_later_of_hold_and_window():
    settings = PolicySettings(driver=DRIVER, recovery_hold_s=2, flap_window_s=10)
    first = policy.judge(faulty(XID_79), None, now=0, settings=settings)
    second = policy.judge(HEALTHY, first.state, now=1, settings=settings)
    assert policy.next_deadline([second.state], settings=settings) == 10


def test_unmonitored_keeps_a_fault_taint_rather_than_replacing_it():
    settings = PolicySettings(driver=DRIVER)
    first = policy.judge(faulty(XID_79), None, now=0, settings=settings)
    unknown = Observation(device="gpu-0", unknown=True, fault=Fault(cause="whatever"))
    second = policy.judge(unknown, first.state, now=1, settings=settings)
    assert second.state.health is Health.UNKNOWN
    assert str(second.state.taint) == XID_79_TAINT
    assert second.apply is None
    assert not second.raised


def test_the_unmonitored_taint_carries_the_monitors_reason():
    settings = PolicySettings(driver=DRIVER)
    unknown = Observation(
        device="gpu-0", unknown=True, fault=Fault(cause="x", message="monitor sim: hung")
    )
    verdict = policy.judge(unknown, None, now=0, settings=settings)
    assert verdict.raised
    assert verdict.state.fault == Fault(cause=policy.UNMONITORED, message="monitor sim: hung")
    assert verdict.apply == Taint(key=f"{DRIVER}/unmonitored", value="", effect="NoSchedule")
