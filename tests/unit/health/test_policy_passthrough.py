"""Devices passed through to virtual machines (docs/vfio.md): the policy does not judge them by
their monitor, which loses a device bound to vfio-pci, and resumes once the claim is gone. Also
what the health record, the prepared-claims view and the partition helper say of them."""

from __future__ import annotations

from collections.abc import Sequence

from services.allocation.node_view.health_board import Health as KubeletHealth
from services.allocation.node_view.health_board import HealthBoard
from services.health import attribution, policy
from services.health.policy import DeviceState, Health, PolicySettings, Taint, Verdict
from services.health.prepared_claims import PreparedClaims
from services.health.recorder import PASSTHROUGH_MESSAGE, state_from_record, to_record
from shared.pb.drasuite.v1 import claim_pb2, health_pb2, inventory_pb2
from shared.vendors.parts.observation import Fault, Observation

DRIVER = "sim.dra-suite.io"
SETTINGS = PolicySettings(driver=DRIVER)
XID = Fault(cause="xid", code="79", message="GPU has fallen off the bus")
XID_TAINT = Taint(key=f"{DRIVER}/xid", value="79", effect="NoSchedule")
UNMONITORED_TAINT = Taint(key=f"{DRIVER}/unmonitored", value="", effect="NoSchedule")
LOST = Fault(cause="gpu-lost", message="NVML: GPU is lost")

HEALTHY = Observation(device="gpu-0")
UNKNOWN = Observation(device="gpu-0", unknown=True)


def step(
    observation: Observation,
    prior: DeviceState | None,
    now: float,
    *,
    passthrough: bool,
    settings: PolicySettings = SETTINGS,
) -> Verdict:
    found = policy.evaluate(
        [observation],
        {} if prior is None else {prior.device: prior},
        now=now,
        settings=settings,
        passthrough={"gpu-0"} if passthrough else (),
    )
    (verdict,) = found.verdicts
    return verdict


def run(
    steps: Sequence[tuple[float, Observation, bool]], *, settings: PolicySettings = SETTINGS
) -> list[Verdict]:
    """(now, observation, passed through) per step: every verdict, in order."""
    verdicts: list[Verdict] = []
    prior: DeviceState | None = None
    for now, observation, passed in steps:
        verdict = step(observation, prior, now, passthrough=passed, settings=settings)
        verdicts.append(verdict)
        prior = verdict.state
    return verdicts


def test_a_passed_through_device_that_the_monitor_loses_is_passthrough_without_a_taint():
    verdicts = run([(0, HEALTHY, False), (1, UNKNOWN, True), (500, UNKNOWN, True)])
    last = verdicts[-1].state
    assert (last.health, last.fault, last.taint) == (Health.PASSTHROUGH, None, None)
    assert last.since == 1  # since it was passed through, not since the last look
    assert not any(v.raised or v.resolved or v.apply or v.remove for v in verdicts)
    assert policy.next_deadline([last], settings=SETTINGS) is None  # nothing to wait for


def test_what_the_monitor_says_of_a_passed_through_device_is_not_judged():
    # NVML may report a GPU that left its driver as lost; a sim monitor still sees it healthy.
    for observation in (Observation(device="gpu-0", fault=LOST), HEALTHY, UNKNOWN):
        verdict = step(observation, None, 5, passthrough=True)
        assert verdict.state.health is Health.PASSTHROUGH, observation
        assert (verdict.raised, verdict.apply) == (False, None)


def test_an_unmonitored_taint_raised_before_the_claim_was_known_ends_at_once():
    # The monitor lost the device when it left its driver, a moment before the prepared claim
    # reached the health agent: the taint goes, even inside the flap window.
    settings = PolicySettings(driver=DRIVER, flap_window_s=60.0, recovery_hold_s=30.0)
    lost = step(UNKNOWN, step(HEALTHY, None, 0, passthrough=False).state, 1, passthrough=False)
    assert lost.state.taint == UNMONITORED_TAINT
    verdict = step(UNKNOWN, lost.state, 2, passthrough=True, settings=settings)
    assert verdict.state.health is Health.PASSTHROUGH
    assert verdict.remove == UNMONITORED_TAINT
    assert verdict.state.taint is None
    assert verdict.resolved is not None
    assert verdict.resolved.fault is not None
    assert verdict.resolved.fault.cause == policy.UNMONITORED
    assert verdict.state.taint_changed == 2


def test_a_fault_in_force_stays_with_its_taint_while_passed_through():
    verdicts = run(
        [
            (0, Observation(device="gpu-0", fault=XID), False),
            (1, HEALTHY, True),
            (9, UNKNOWN, True),
        ],
        settings=PolicySettings(driver=DRIVER, recovery_hold_s=5.0),
    )
    last = verdicts[-1].state
    assert (last.health, last.fault, last.taint) == (Health.UNHEALTHY, XID, XID_TAINT)
    assert last.healthy_since is None  # looking healthy while passed through is no recovery
    assert not any(v.resolved or v.remove for v in verdicts)


def test_after_the_claim_a_device_the_monitor_cannot_see_is_unmonitored_again():
    verdicts = run([(0, UNKNOWN, True), (1, UNKNOWN, True), (2, UNKNOWN, False)])
    last = verdicts[-1]
    assert last.raised
    assert last.apply == UNMONITORED_TAINT
    assert last.state.health is Health.UNKNOWN
    assert last.resolved is None


def test_after_the_claim_a_device_back_on_its_driver_is_healthy_without_events():
    verdicts = run([(0, UNKNOWN, True), (1, HEALTHY, False)])
    last = verdicts[-1]
    assert (last.state.health, last.state.since) == (Health.HEALTHY, 1)
    assert not (last.raised)
    assert not (last.resolved)
    assert not (last.apply)
    assert last.remove is None


def test_after_the_claim_a_fault_kept_meanwhile_recovers_through_the_hold():
    settings = PolicySettings(driver=DRIVER, recovery_hold_s=5.0)
    faulty = Observation(device="gpu-0", fault=XID)
    steps = [(0, faulty, False), (1, UNKNOWN, True), (10, HEALTHY, False), (16, HEALTHY, False)]
    verdicts = run(steps, settings=settings)
    assert verdicts[2].state.taint == XID_TAINT  # the hold starts when it is back: 10
    assert verdicts[3].resolved is not None
    assert verdicts[3].remove == XID_TAINT


# --- the health record -----------------------------------------------------------------------


def test_the_record_says_unknown_with_cause_passthrough_and_comes_back_the_same():
    state = DeviceState(device="gpu-0", health=Health.PASSTHROUGH, since=12.5)
    record = to_record(state, driver=DRIVER, node="node-a", pool="node-a", taint=None)
    assert record.state == health_pb2.HEALTH_STATE_UNKNOWN  # the kubelet's Unknown
    assert (record.cause, record.code, record.message) == (
        "passthrough",
        "vfio",
        PASSTHROUGH_MESSAGE,
    )
    assert (record.taint, list(record.taints)) == ("", [])
    back = state_from_record(record, now=20.0)
    assert back == state


def test_the_kubelet_sees_the_record_as_unknown_with_its_reason():
    """The allocation agent's health board, which feeds NodeWatchResources."""
    state = DeviceState(device="gpu-0", health=Health.PASSTHROUGH, since=12.5)
    board = HealthBoard(pool="node-a", clock=lambda: 100.0)
    board.set_devices(["gpu-0"])
    board.put("gpu-0", to_record(state, driver=DRIVER, node="node-a", pool="node-a", taint=None))
    (view,) = board.snapshot()
    assert (view.health, view.message) == (KubeletHealth.UNKNOWN, PASSTHROUGH_MESSAGE)


def test_an_unmonitored_record_is_not_taken_for_passthrough():
    record = health_pb2.DeviceHealth(
        device="gpu-0", state=health_pb2.HEALTH_STATE_UNKNOWN, cause="unmonitored", since_unix_ms=1
    )
    back = state_from_record(record, now=20.0)
    assert back.health is Health.UNKNOWN
    assert back.fault is not None


# --- which devices: the prepared claims, and the partitions carved from them -----------------


def _claim(
    uid: str, *devices: tuple[str, claim_pb2.DevicePassthrough.ValueType]
) -> claim_pb2.PreparedClaim:
    return claim_pb2.PreparedClaim(
        driver=DRIVER,
        node="node-a",
        claim_uid=uid,
        devices=[
            claim_pb2.PreparedClaimDevice(pool="node-a", device=name, passthrough=mode)
            for name, mode in devices
        ],
    )


def test_the_prepared_claims_name_the_devices_passed_through():
    claims = PreparedClaims()
    claims.put("vm", _claim("vm", ("gpu-0", claim_pb2.DEVICE_PASSTHROUGH_VFIO)))
    claims.put("pod", _claim("pod", ("gpu-1", claim_pb2.DEVICE_PASSTHROUGH_NONE)))
    assert claims.passthrough() == {("node-a", "gpu-0")}
    claims.remove("vm")
    assert claims.passthrough() == frozenset()


def test_a_device_passed_through_takes_its_partitions_with_it():
    inventory = inventory_pb2.Inventory(
        devices=[
            inventory_pb2.Device(name="gpu-0", kind="gpu"),
            inventory_pb2.Device(name="gpu-0-mig-1g10gb-19-0", kind="mig", parent="gpu-0"),
            inventory_pb2.Device(name="gpu-1", kind="gpu"),
            inventory_pb2.Device(name="gpu-1-mig-1g10gb-19-0", kind="mig", parent="gpu-1"),
        ]
    )
    topology = attribution.topology(inventory)
    assert attribution.with_partitions({"gpu-0"}, topology) == {"gpu-0", "gpu-0-mig-1g10gb-19-0"}
    assert attribution.with_partitions(set(), topology) == frozenset()
