"""The taints a device's health record carries (`DeviceHealth.taints`), with stable times.

Every taint the agent wants on a device now (its fault taint, a manual drain) goes into its
record, whatever the taint target: with `--taint-target slice` the discovery agent publishes
them inside the ResourceSlice. `time_added` is when a taint was first added: it stays while
the taint (key, value and effect) stays, also across restarts (`seed()` from the records an
earlier run left), and a taint that goes and comes back is added anew. Pure: `now` is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from services.health.policy import Taint
from shared.pb.drasuite.v1 import health_pb2

__all__ = ["TaintTimes", "from_record"]


def from_record(taint: health_pb2.DeviceTaint) -> Taint:
    return Taint(key=taint.key, value=taint.value, effect=taint.effect)


class TaintTimes:
    """When each device's current taints were first added (Unix milliseconds)."""

    def __init__(self) -> None:
        self._added: dict[str, dict[Taint, int]] = {}

    def seed(self, device: str, taints: Iterable[health_pb2.DeviceTaint]) -> None:
        """The times a record left by an earlier run gives (kept while the taints are)."""
        found = {from_record(t): t.time_added_unix_ms for t in taints if t.time_added_unix_ms}
        if found:
            self._added[device] = found

    def stamp(
        self, wanted: Mapping[str, Sequence[Taint]], *, now: float
    ) -> dict[str, list[health_pb2.DeviceTaint]]:
        """Each device's wanted taints (duplicates dropped) with the time each was first added;
        taints no longer wanted, and devices not in `wanted`, are forgotten."""
        now_ms = int(now * 1000)
        stamped: dict[str, list[health_pb2.DeviceTaint]] = {}
        added: dict[str, dict[Taint, int]] = {}
        for device, taints in wanted.items():
            before = self._added.get(device, {})
            times = added[device] = {}
            for taint in taints:
                if taint not in times:
                    times[taint] = before.get(taint, now_ms)
            stamped[device] = [
                health_pb2.DeviceTaint(
                    key=t.key, value=t.value, effect=t.effect, time_added_unix_ms=ms
                )
                for t, ms in times.items()
            ]
        self._added = {device: times for device, times in added.items() if times}
        return stamped
