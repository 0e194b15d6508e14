"""The taints a health record carries: every wanted taint, with when it was first added."""

from __future__ import annotations

from services.health.policy import Taint
from services.health.record_taints import TaintTimes, from_record
from shared.pb.drasuite.v1 import health_pb2

DRIVER = "sim.dra-suite.io"
XID = Taint(key=f"{DRIVER}/xid", value="79", effect="NoSchedule")
XID_48 = Taint(key=f"{DRIVER}/xid", value="48", effect="NoSchedule")
DRAIN = Taint(key=f"{DRIVER}/drain", value="rma", effect="NoSchedule")


def added(stamped: dict[str, list[health_pb2.DeviceTaint]]) -> dict[str, list[tuple[str, int]]]:
    return {d: [(t.value, t.time_added_unix_ms) for t in ts] for d, ts in stamped.items()}


def test_a_taint_keeps_the_time_it_was_first_added_while_it_stays():
    times = TaintTimes()
    assert added(times.stamp({"gpu-0": [XID], "gpu-1": []}, now=10.0)) == {
        "gpu-0": [("79", 10_000)],
        "gpu-1": [],
    }
    later = times.stamp({"gpu-0": [XID, DRAIN], "gpu-1": []}, now=20.5)
    assert added(later) == {"gpu-0": [("79", 10_000), ("rma", 20_500)], "gpu-1": []}
    (first, _) = later["gpu-0"]
    assert (first.key, first.value, first.effect) == (XID.key, "79", "NoSchedule")


def test_a_changed_or_returning_taint_is_added_anew():
    times = TaintTimes()
    times.stamp({"gpu-0": [XID]}, now=1.0)
    assert added(times.stamp({"gpu-0": [XID_48]}, now=2.0)) == {"gpu-0": [("48", 2_000)]}
    assert added(times.stamp({"gpu-0": []}, now=3.0)) == {"gpu-0": []}
    assert added(times.stamp({"gpu-0": [XID_48]}, now=4.0)) == {"gpu-0": [("48", 4_000)]}


def test_a_device_that_leaves_forgets_its_times():
    times = TaintTimes()
    times.stamp({"gpu-0": [XID]}, now=1.0)
    times.stamp({}, now=2.0)
    assert added(times.stamp({"gpu-0": [XID]}, now=3.0)) == {"gpu-0": [("79", 3_000)]}


def test_duplicate_taints_are_recorded_once():
    stamped = TaintTimes().stamp({"gpu-0": [XID, XID]}, now=1.0)
    assert added(stamped) == {"gpu-0": [("79", 1_000)]}


def test_times_from_an_earlier_runs_record_carry_over():
    record = health_pb2.DeviceHealth(
        device="gpu-0",
        taints=[
            health_pb2.DeviceTaint(
                key=XID.key, value="79", effect="NoSchedule", time_added_unix_ms=5_000
            ),
            health_pb2.DeviceTaint(key=DRAIN.key, value="rma", effect="NoSchedule"),  # no time
        ],
    )
    assert [from_record(t) for t in record.taints] == [XID, DRAIN]
    times = TaintTimes()
    times.seed("gpu-0", record.taints)
    stamped = times.stamp({"gpu-0": [XID, DRAIN]}, now=9.0)
    assert added(stamped) == {"gpu-0": [("79", 5_000), ("rma", 9_000)]}
