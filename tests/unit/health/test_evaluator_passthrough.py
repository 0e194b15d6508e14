"""The evaluator and devices passed through to virtual machines: which devices it treats so
(the prepared claims' of its pool, their partitions, what an earlier run recorded until the
claims are read), and that it keeps them when the monitor stops reporting them. The KV, the
taint writer, Events and alerts are stood in for by recording fakes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from services.health import attribution
from services.health.evaluator import HealthEvaluator
from services.health.policy import DeviceState, Health, PolicySettings, Taint
from services.health.recorder import to_record
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2
from shared.vendors.parts.observation import Observation, Observations
from tests.unit.health.evaluator_sink import Sink

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
UNMONITORED = f"{DRIVER}/unmonitored"


class Recorder:
    def __init__(self, existing: Mapping[str, health_pb2.DeviceHealth] = {}) -> None:
        self._existing = dict(existing)
        self.records: dict[str, health_pb2.DeviceHealth] = {}

    async def existing(self) -> dict[str, health_pb2.DeviceHealth]:
        return self._existing

    def set(self, records: Mapping[str, health_pb2.DeviceHealth]) -> None:
        self.records = dict(records)

    def due(self) -> bool:
        return True

    async def flush(self, *, device: str | None = None) -> bool:
        return True


class Taints:
    def __init__(self) -> None:
        self.wanted: dict[str, Taint] = {}

    def want(self, taints: Mapping[str, Taint], *, pool: str, contexts: Any) -> None:
        self.wanted = dict(taints)

    def restore(self, device: str, taints: Iterable[Taint]) -> None:
        pass

    def applied(self, taint: Taint | None) -> Taint | None:
        return taint

    def drain_taint(self, device: str) -> Taint | None:
        return None

    def answers_from(self) -> tuple[object, ...]:
        return ()


def evaluator(recorder: Recorder | None = None) -> tuple[HealthEvaluator, Recorder, Taints]:
    recorder = recorder or Recorder()
    taints = Taints()
    found = HealthEvaluator(
        settings=PolicySettings(driver=DRIVER),
        node=NODE,
        recorder=cast(Any, recorder),
        taints=cast(Any, taints),
        events=cast(Any, Sink()),
        alerts=cast(Any, Sink()),
        poll_interval_s=1.0,
        clock=lambda: 100.0,
    )
    return found, recorder, taints


def view(*devices: str, unknown: Iterable[str] = ()) -> Observations:
    blind = set(unknown)
    return Observations(
        pool=NODE,
        devices=tuple(Observation(device=d, unknown=d in blind) for d in devices),
    )


def health(agent: HealthEvaluator) -> dict[str, Health]:
    return {d: s.health for d, s in agent.states.items()}


async def test_only_the_claimed_devices_of_its_pool_pass_through() -> None:
    agent, recorder, taints = evaluator()
    agent.set_passthrough([(NODE, "gpu-0"), ("another-pool", "gpu-1")])
    agent.observe(view("gpu-0", "gpu-1", unknown={"gpu-0", "gpu-1"}))
    await agent.evaluate()
    assert health(agent) == {"gpu-0": Health.PASSTHROUGH, "gpu-1": Health.UNKNOWN}
    assert {d: t.key for d, t in taints.wanted.items()} == {"gpu-1": UNMONITORED}
    assert recorder.records["gpu-0"].cause == "passthrough"


async def test_a_device_the_monitor_stops_reporting_is_kept_while_passed_through() -> None:
    agent, recorder, taints = evaluator()
    agent.observe(view("gpu-0", "gpu-1"))
    await agent.evaluate()
    agent.set_passthrough([(NODE, "gpu-0"), (NODE, "gpu-9")])  # gpu-9: no device of this node
    agent.observe(view("gpu-1"))
    await agent.evaluate()
    assert health(agent) == {"gpu-0": Health.PASSTHROUGH, "gpu-1": Health.HEALTHY}
    assert sorted(recorder.records) == ["gpu-0", "gpu-1"]
    # Unprepared, and still not reported: it left, as any device the monitor no longer names.
    agent.set_passthrough([])
    await agent.evaluate()
    assert health(agent) == {"gpu-1": Health.HEALTHY}
    assert taints.wanted == {}


async def test_partitions_of_a_passed_through_device_pass_through_with_it() -> None:
    agent, _, taints = evaluator()
    agent.set_topology(
        attribution.topology(
            inventory_pb2.Inventory(
                devices=[
                    inventory_pb2.Device(name="gpu-0", kind="gpu"),
                    inventory_pb2.Device(name="gpu-0-mig-1g10gb-19-0", kind="mig", parent="gpu-0"),
                ]
            )
        )
    )
    agent.set_passthrough([(NODE, "gpu-0")])
    agent.observe(view("gpu-0", unknown={"gpu-0"}))
    await agent.evaluate()
    assert health(agent) == {
        "gpu-0": Health.PASSTHROUGH,
        "gpu-0-mig-1g10gb-19-0": Health.PASSTHROUGH,
    }
    assert taints.wanted == {}


async def test_until_the_claims_are_read_what_an_earlier_run_recorded_holds() -> None:
    left = DeviceState(device="gpu-0", health=Health.PASSTHROUGH, since=50.0)
    record = to_record(left, driver=DRIVER, node=NODE, pool=NODE, taint=None)
    agent, _, taints = evaluator(Recorder({"gpu-0": record}))
    agent.observe(view("gpu-0", unknown={"gpu-0"}))
    await agent.evaluate()
    assert health(agent) == {"gpu-0": Health.PASSTHROUGH}
    assert agent.states["gpu-0"].since == 50.0
    assert taints.wanted == {}
    # The claims are read, and none passes it through any more: judged as any device.
    agent.set_passthrough([])
    await agent.evaluate()
    assert health(agent) == {"gpu-0": Health.UNKNOWN}
    assert {d: t.key for d, t in taints.wanted.items()} == {"gpu-0": UNMONITORED}
