"""The nvml monitor through the fake NVML seam: events and counters become the policy's faults."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from services.health import monitors, policy
from services.health.monitors.watchdog import Watchdog
from services.health.policy import Health, PolicySettings
from services.health.rules import classify, default_rules
from shared.backoff import Backoff
from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.errors import BackendLoadError, BackendUnavailableError
from shared.vendors.nvidia.monitor import NvmlMonitor
from shared.vendors.nvidia.nvml_events import (
    ERROR_GPU_IS_LOST,
    ERROR_NOT_SUPPORTED,
    EVENT_DOUBLE_BIT_ECC,
    EVENT_GPU_UNAVAILABLE,
    EVENT_SINGLE_BIT_ECC,
    NO_INSTANCE,
    NVMLCallError,
    NVMLEvents,
    RemappedRows,
)
from shared.vendors.parts.observation import Fault, Observations
from tests.fakes.nvml_events import FakeNVMLEvents

DRIVER = "sim.dra-suite.io"
SETTINGS = PolicySettings(driver=DRIVER)
NAMES = ("gpu-0", "gpu-1", "gpu-2", "gpu-3")


class Sink:
    def __init__(self) -> None:
        self.views: list[Observations] = []
        self.news = asyncio.Event()

    def __call__(self, view: Observations) -> None:
        self.views.append(view)
        self.news.set()

    async def until(
        self, check: Callable[[Observations], bool], timeout_s: float = 5.0
    ) -> Observations:
        async with asyncio.timeout(timeout_s):
            while not (self.views and check(self.views[-1])):
                self.news.clear()
                await self.news.wait()
        return self.views[-1]


def policy_ignores(fault: Fault) -> bool:
    return classify(cause=fault.cause, code=fault.code, rules=default_rules()) is None


def monitor_of(fake: FakeNVMLEvents, **options: object) -> NvmlMonitor:
    fake.init()
    settings: dict[str, object] = {"wait_ms": 20, "counters_s": 0.05, "refresh_s": 0.1}
    settings.update(options)
    return NvmlMonitor(fake, pool="node-a", **settings)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(monitor: NvmlMonitor | Watchdog) -> AsyncIterator[Sink]:
    sink = Sink()
    task = asyncio.create_task(monitor.run(sink))
    try:
        await sink.until(lambda view: True)
        yield sink
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def fault_of(view: Observations, device: str) -> Fault | None:
    return next(o.fault for o in view.devices if o.device == device)


def verdict(view: Observations, device: str) -> policy.Verdict:
    observation = next(o for o in view.devices if o.device == device)
    return policy.judge(observation, None, now=0.0, settings=SETTINGS)


@dataclass(frozen=True)
class Case:
    inject: Callable[[FakeNVMLEvents], None]
    cause: str | None
    code: str
    health: Health
    taint: str | None


def _counters(**fields: object) -> Callable[[FakeNVMLEvents], None]:
    def inject(fake: FakeNVMLEvents) -> None:
        for name, value in fields.items():
            setattr(fake.gpus[1], name, value)

    return inject


PENDING = RemappedRows(corrected=0, uncorrected=2, pending=True, failed=False)
FAILED = RemappedRows(corrected=0, uncorrected=9, pending=False, failed=True)
CASES = {
    "xid 79 taints with its code": Case(
        lambda f: f.xid(1, 79), "xid", "79", Health.UNHEALTHY, f"{DRIVER}/xid=79:NoSchedule"
    ),
    "xid 13 is an application error": Case(
        lambda f: f.xid(1, 13), "xid", "13", Health.HEALTHY, None
    ),
    "double-bit ecc event": Case(
        lambda f: f.double_bit_ecc(1),
        "ecc",
        "double-bit",
        Health.UNHEALTHY,
        f"{DRIVER}/ecc=double-bit:NoSchedule",
    ),
    "single-bit ecc event is no fault": Case(
        lambda f: f.event(1, EVENT_SINGLE_BIT_ECC), None, "", Health.HEALTHY, None
    ),
    "gpu unavailable event": Case(
        lambda f: f.event(1, EVENT_GPU_UNAVAILABLE),
        "gpu-lost",
        "",
        Health.UNHEALTHY,
        f"{DRIVER}/gpu-lost=:NoSchedule",
    ),
    "a lost gpu's counters": Case(
        lambda f: f.lose(1), "gpu-lost", "", Health.UNHEALTHY, f"{DRIVER}/gpu-lost=:NoSchedule"
    ),
    "volatile double-bit count": Case(
        _counters(double_bit_errors=2), "ecc", "double-bit", Health.UNHEALTHY, None
    ),
    "row remap pending": Case(
        _counters(remapped_rows=PENDING), "row-remap", "pending", Health.UNHEALTHY, None
    ),
    "row remap failed": Case(
        _counters(remapped_rows=FAILED), "row-remap", "failed", Health.UNHEALTHY, None
    ),
    "page retirement pending": Case(
        _counters(pages_pending=True), "page-retirement", "pending", Health.UNHEALTHY, None
    ),
    "xid on a mig instance nvml cannot describe lands on its gpu": Case(
        lambda f: f.event(1, 0x8, 94, gpu_instance=3), "xid", "94", Health.UNHEALTHY, None
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_events_and_counters_become_faults_the_policy_judges(case: Case) -> None:
    fake = FakeNVMLEvents()
    async with running(monitor_of(fake)) as sink:
        case.inject(fake)
        if case.cause is None:
            await asyncio.sleep(0.2)
            view = sink.views[-1]
        else:
            view = await sink.until(lambda v: fault_of(v, "gpu-1") is not None)
    fault = fault_of(view, "gpu-1")
    found = (fault.cause, fault.code) if fault is not None else (None, "")
    assert found == (case.cause, case.code)
    judged = verdict(view, "gpu-1")
    assert judged.state.health is case.health
    if case.taint is not None:
        assert str(judged.state.taint) == case.taint
    assert [fault_of(view, d) for d in ("gpu-0", "gpu-2", "gpu-3")] == [None, None, None]


async def test_devices_are_named_by_nvml_index_as_discovery_names_them() -> None:
    async with running(monitor_of(FakeNVMLEvents())) as sink:
        view = sink.views[-1]
    assert tuple(o.device for o in view.devices) == NAMES
    assert view.pool == "node-a"


async def test_an_ignored_xid_never_hides_an_earlier_fault() -> None:
    fake = FakeNVMLEvents()
    async with running(monitor_of(fake, ignored=policy_ignores)) as sink:
        fake.xid(1, 79)
        await sink.until(lambda v: fault_of(v, "gpu-1") is not None)
        fake.xid(1, 13)
        fake.xid(2, 13)
        await asyncio.sleep(0.2)
        view = sink.views[-1]
    assert fault_of(view, "gpu-1") == Fault(cause="xid", code="79", message="XID 79")
    assert fault_of(view, "gpu-2") is None


async def test_a_more_severe_fault_replaces_a_milder_one() -> None:
    fake = FakeNVMLEvents()
    async with running(monitor_of(fake)) as sink:
        fake.xid(1, 79)
        await sink.until(lambda v: fault_of(v, "gpu-1") is not None)
        fake.event(1, EVENT_GPU_UNAVAILABLE)
        view = await sink.until(
            lambda v: (fault_of(v, "gpu-1") or Fault(cause="")).cause == "gpu-lost"
        )
        fake.xid(1, 48)
        await asyncio.sleep(0.1)
    assert fault_of(sink.views[-1], "gpu-1") == fault_of(view, "gpu-1")


async def test_an_event_from_a_gpu_nvml_cannot_name_marks_every_gpu_lost() -> None:
    fake = FakeNVMLEvents()
    async with running(monitor_of(fake)) as sink:
        fake.lose(2)
        fake.xid(2, 79)  # its UUID can no longer be read
        view = await sink.until(lambda v: all(o.fault for o in v.devices))
    assert {o.fault.cause for o in view.devices if o.fault} == {"gpu-lost"}


async def test_a_wait_answering_gpu_is_lost_marks_every_gpu_lost() -> None:
    fake = FakeNVMLEvents()
    async with running(monitor_of(fake)) as sink:
        fake.wait_error = NVMLCallError("event_set_wait", code=ERROR_GPU_IS_LOST, message="lost")
        view = await sink.until(lambda v: all(o.fault for o in v.devices))
    assert {o.fault.cause for o in view.devices if o.fault} == {"gpu-lost"}


async def test_event_waits_timing_out_again_and_again_are_no_fault() -> None:
    fake = FakeNVMLEvents()
    monitor = monitor_of(fake, wait_ms=10)
    async with running(monitor) as sink:
        await asyncio.sleep(0.5)
    assert monitor.waits >= 10
    assert len(sink.views) >= 3  # the unchanged view is re-reported: the watchdog sees life
    assert all(o.fault is None and not o.unknown for v in sink.views for o in v.devices)


async def test_any_other_wait_error_fails_the_monitor() -> None:
    fake = FakeNVMLEvents()
    monitor = monitor_of(fake)
    sink = Sink()
    task = asyncio.create_task(monitor.run(sink))
    await sink.until(lambda view: True)
    fake.wait_error = NVMLCallError("event_set_wait", code=999, message="Unknown Error")
    with pytest.raises(BackendUnavailableError, match="Unknown Error"):
        await asyncio.wait_for(task, 5)
    await asyncio.sleep(0.05)
    assert fake.event_sets[0].freed


async def test_a_gpu_whose_events_cannot_be_registered_is_unmonitored() -> None:
    fake = FakeNVMLEvents()
    fake.gpus[3].supported_events = 0
    fake.fail["register_events"] = NVMLCallError(
        "register_events", code=ERROR_NOT_SUPPORTED, message="x"
    )
    async with running(monitor_of(fake)) as sink:
        view = sink.views[-1]
    assert all(o.unknown for o in view.devices)
    assert all(o.fault and "registration failed" in o.fault.message for o in view.devices)


async def test_a_wedged_nvml_call_makes_the_watchdog_mark_devices_unmonitored() -> None:
    fake = FakeNVMLEvents()
    monitor = monitor_of(fake, call_timeout_s=0.2)
    watchdog = Watchdog(
        monitor, name="nvml", deadline_s=5.0, restart=Backoff(initial_s=0.05, max_s=0.05)
    )
    try:
        async with running(watchdog) as sink:
            fake.wedge()
            view = await sink.until(lambda v: all(o.unknown for o in v.devices))
            assert all(o.fault and o.fault.cause == policy.UNMONITORED for o in view.devices)
            assert [o.device for o in view.devices] == list(NAMES)
            assert not watchdog.monitored
            fake.unwedge()
            back = await sink.until(lambda v: not any(o.unknown for o in v.devices))
        assert all(o.fault is None for o in back.devices)
        assert watchdog.monitored
    finally:
        fake.unwedge()


async def test_the_event_set_is_freed_when_the_monitor_stops() -> None:
    fake = FakeNVMLEvents()
    async with running(monitor_of(fake)):
        pass
    await asyncio.sleep(0.1)  # freed once the pending wait returns
    assert [s.freed for s in fake.event_sets] == [True]
    assert fake.event_sets[0].registered == {i: 0x4000 | 0xB for i in range(4)}


async def test_loading_nvml_without_a_driver_fails_with_nvml_is_not_available(
    nats_settings_offline: NATSSettings,
) -> None:
    fake = FakeNVMLEvents()
    fake.init_error = NVMLCallError("init", code=12, message="Driver Not Loaded")
    bus = Bus(nats_settings_offline, name="test")
    with pytest.raises(BackendLoadError, match=r"NVML is not available: .*Driver Not Loaded"):
        monitors.load("nvml", bus=bus, driver=DRIVER, node="node-a", nvml_library=fake)
    loaded = monitors.load(
        "nvml", bus=bus, driver=DRIVER, node="node-a", nvml_library=FakeNVMLEvents()
    )
    assert isinstance(loaded, NvmlMonitor)


@pytest.fixture
def nats_settings_offline() -> NATSSettings:
    return NATSSettings(url="nats://127.0.0.1:1")


# --- MIG instances ---------------------------------------------------------------------------

PARTITION = "gpu-1-mig-1g10gb-19-3"
"""The partition the inventory publishes at profile 19, placement 3 of gpu-1."""


def test_the_fake_is_an_nvml_events_library() -> None:
    library: NVMLEvents = FakeNVMLEvents()
    assert library.device_count is not None


def published(partitions: dict[tuple[str, int, int], str]) -> Callable[[str, int, int], str | None]:
    """The inventory's MIG partitions, as the agent looks them up (may change later)."""

    def lookup(gpu: str, profile_id: int, start: int) -> str | None:
        return partitions.get((gpu, profile_id, start))

    return lookup


def mig_fake() -> FakeNVMLEvents:
    """gpu-1 with GPU instance 7 (1g, profile 19) at memory slice 3."""
    fake = FakeNVMLEvents()
    fake.add_gpu_instance(1, 7, profile_id=19, start=3)
    return fake


def fault_on(view: Observations, device: str) -> Fault | None:
    return next((o.fault for o in view.devices if o.device == device), None)


async def test_an_xid_on_a_mig_instance_is_the_fault_of_the_partition_there_alone() -> None:
    fake = mig_fake()
    partitions = published({("gpu-1", 19, 3): PARTITION})
    async with running(monitor_of(fake, mig_partition=partitions)) as sink:
        fake.xid(1, 79, gpu_instance=7, compute_instance=0)
        view = await sink.until(lambda v: fault_on(v, PARTITION) is not None)
    fault = fault_on(view, PARTITION)
    assert fault is not None
    assert (fault.cause, fault.code) == ("xid", "79")
    assert "GPU instance 7" in fault.message
    assert [fault_of(view, d) for d in NAMES] == [None, None, None, None]
    assert [o.device for o in view.devices] == [*NAMES, PARTITION]


@pytest.mark.parametrize(
    ("gpu_instance", "partitions"),
    [
        (NO_INSTANCE, {("gpu-1", 19, 3): PARTITION}),
        (9, {("gpu-1", 19, 3): PARTITION}),
        (7, {("gpu-1", 19, 4): "gpu-1-mig-1g10gb-19-4", ("gpu-0", 19, 3): "gpu-0-mig-1g10gb-19-3"}),
    ],
    ids=[
        "not tied to an instance (0xFFFFFFFF)",
        "an instance nvml does not know",
        "an instance the inventory publishes no partition for",
    ],
)
async def test_an_xid_not_attributable_to_a_partition_is_the_gpus(
    gpu_instance: int, partitions: dict[tuple[str, int, int], str]
) -> None:
    fake = mig_fake()
    async with running(monitor_of(fake, mig_partition=published(partitions))) as sink:
        fake.xid(1, 79, gpu_instance=gpu_instance)
        view = await sink.until(lambda v: fault_of(v, "gpu-1") is not None)
    fault = fault_of(view, "gpu-1")
    assert fault is not None
    assert (fault.cause, fault.code) == ("xid", "79")
    assert [o.device for o in view.devices] == list(NAMES)


async def test_a_partition_published_after_the_xid_takes_its_instances_fault() -> None:
    fake = mig_fake()
    partitions: dict[tuple[str, int, int], str] = {}
    async with running(monitor_of(fake, mig_partition=published(partitions))) as sink:
        fake.xid(1, 79, gpu_instance=7)
        await sink.until(lambda v: fault_of(v, "gpu-1") is not None)
        fake.remove_gpu_instance(1, 7)  # the fault stays with the placement it was seen on
        partitions[("gpu-1", 19, 3)] = PARTITION
        view = await sink.until(lambda v: fault_on(v, PARTITION) is not None)
    assert fault_of(view, "gpu-1") is None


async def test_an_instances_application_xids_are_ignored_and_its_memory_errors_are_the_gpus() -> (
    None
):
    fake = mig_fake()
    fake.add_gpu_instance(1, 8, profile_id=19, start=4)
    partitions = published({("gpu-1", 19, 3): PARTITION, ("gpu-1", 19, 4): "gpu-1-mig-1g10gb-19-4"})
    monitor = monitor_of(fake, mig_partition=partitions, ignored=policy_ignores)
    async with running(monitor) as sink:
        fake.xid(1, 13, gpu_instance=8)  # an application error: no fault
        fake.xid(1, 79, gpu_instance=7)
        fake.xid(1, 13, gpu_instance=7)  # never hides the fault before it
        fake.event(1, EVENT_DOUBLE_BIT_ECC, gpu_instance=8)  # memory errors are the GPU's
        view = await sink.until(lambda v: fault_of(v, "gpu-1") is not None)
        await asyncio.sleep(0.1)
        view = sink.views[-1]
    assert (fault_on(view, PARTITION) or Fault(cause="")).code == "79"
    assert fault_on(view, "gpu-1-mig-1g10gb-19-4") is None
    assert (fault_of(view, "gpu-1") or Fault(cause="")).cause == "ecc"
