"""Contract: on the same `npu-smi` output, the health monitor watches exactly the devices the
discovery agent publishes, under the same names, and a fault on a chip names that chip's device.

The ResourceSlices are the contract (docs/contracts.md §4.1, §5): a DeviceTaintRule or an alert
naming a device discovery did not publish taints nothing, or the wrong chip. Both agents run
here for real on one output: discovery's Ascend backend scan (through the `FakeNpuSmi`
command runner) and the health monitor's poll (through its `runner` seam), over every
captured `npu-smi info` fixture (910B, 910A, 310P, A3) and over generated tables (hypothesis).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.discovery import inventory
from services.health import attribution
from shared.vendors.ascend import discovery as ascend
from shared.vendors.ascend.monitor import AscendMonitor
from shared.vendors.parts.observation import Observations
from shared.vendors.parts.sysfs import Sysfs
from tests.fakes.npusmi import FIXTURES, FakeNpuSmi

HEALTH_FIXTURES = Path(__file__).parents[1] / "unit" / "health" / "fixtures"
INFO_CAPTURES = {
    # Every `npu-smi info` table the tests hold, with the topo matrix captured beside it (None:
    # one is made up from the table, as the topo only gives `topologyGroup`).
    FIXTURES / "910b3-8npu.txt": FIXTURES / "910b3-topo-published.txt",
    FIXTURES / "910b3-8npu-published.txt": None,
    FIXTURES / "910b1-single.txt": None,
    FIXTURES / "910a-8npu.txt": FIXTURES / "910a-topo.txt",
    FIXTURES / "310p3-published.txt": FIXTURES / "310p3-topo.txt",
    FIXTURES / "310p3-vnpu.txt": FIXTURES / "310p3-topo.txt",
    FIXTURES / "a3-16die.txt": FIXTURES / "a3-topo.txt",
    HEALTH_FIXTURES / "npu-smi-info-310p3.txt": FIXTURES / "310p3-topo.txt",
    HEALTH_FIXTURES / "npu-smi-info-910b3.txt": None,
    HEALTH_FIXTURES / "npu-smi-info-910b3-faults.txt": None,
}
NOT_INFO_TABLES = re.compile(r"topo|garbage|truncated|bad-bus-id|header-only|info-vnpu")
"""Fixtures of the npu-smi folder that are not a good `npu-smi info` table."""
ALARM = HEALTH_FIXTURES / "npu-smi-health-alarm.txt"
_CHIP_ROW = re.compile(
    r"^(\|\s*\d+\s+\S[^|]*\|\s*)(OK|Warning|Alarm|Critical|UNKNOWN)(\s*\|)", re.MULTILINE
)


@dataclass(frozen=True, slots=True)
class Output:
    """One node's npu-smi: the `info` table and the topo matrix."""

    info: str
    topo: str


def _topo_labels(info: str) -> list[int]:
    """The ids npu-smi labels topo rows with: the device id of an id column, else the card."""
    lines = info.splitlines()
    labels = []
    for k, line in enumerate(lines):
        if (first := _CHIP_ROW.match(line)) is not None and k + 1 < len(lines):
            ids = lines[k + 1].strip().strip("|").split("|")[0].split()
            card = first.group(1).strip("| ").split()[0]
            labels.append(int(ids[1] if len(ids) == 2 else card))
    return labels


def _made_up_topo(info: str) -> str:
    """A topo matrix of every chip of `info`, all on one HCCS ring."""
    ids = _topo_labels(info)
    header = "\t   " + "".join(f"NPU{i:<8}" for i in ids) + "CPU Affinity"
    rows = [
        f"NPU{a:<8}" + "".join(f"{'X' if a == b else 'HCCS':<11}" for b in ids) + "0-23"
        for a in ids
    ]
    return "\n".join([header, *rows, "", "Legend:", ""])


def _output(info_path: Path) -> Output:
    info = info_path.read_text()
    topo = INFO_CAPTURES[info_path]
    return Output(info, topo.read_text() if topo is not None else _made_up_topo(info))


def _with_health(info: str, unwell: int | None, word: str = "Alarm") -> str:
    """`info` with every chip OK but the `unwell`-th (in table order), which says `word`."""
    count = iter(range(10_000))

    def replace(match: re.Match[str]) -> str:
        health = word if next(count) == unwell else "OK"
        return f"{match.group(1)}{health:<{len(match.group(2))}}{match.group(3)}"

    return _CHIP_ROW.sub(replace, info)


class Runner:
    """The health monitor's command seam: `info` prints the table, `-t health` an alarm."""

    def __init__(self, info: str) -> None:
        self.info = info
        self.health_queries: list[tuple[str, str]] = []

    async def __call__(self, argv: Sequence[str], timeout_s: float) -> str:
        args = list(argv[1:])
        if args == ["info"]:
            return self.info
        if args[:3] == ["info", "-t", "health"]:
            self.health_queries.append((args[args.index("-i") + 1], args[args.index("-c") + 1]))
            return ALARM.read_text()
        raise AssertionError(f"unexpected npu-smi call {argv}")


async def _published(output: Output, fake: FakeNpuSmi | None = None) -> list[str]:
    """Discovery's whole devices (not partitions), in the order of the table."""
    fake = fake or FakeNpuSmi()
    fake.outputs[("info",)] = output.info
    fake.outputs[("info", "-t", "topo")] = output.topo
    scan = await ascend.AscendBackend(run_command=fake, sysfs=Sysfs("/nonexistent")).scan()
    return [d.name for d in scan.devices if not d.parent]


async def _monitored(info: str) -> tuple[Observations, Runner]:
    runner = Runner(info)
    return await AscendMonitor(pool="n1", runner=runner).poll(), runner


def test_every_captured_info_table_is_in_this_contract():
    tables = {
        p
        for p in FIXTURES.glob("*.txt")
        if not NOT_INFO_TABLES.search(p.name) and p.name != "README.md"
    }
    tables |= set(HEALTH_FIXTURES.glob("npu-smi-info-*.txt"))
    assert tables == set(INFO_CAPTURES)


@pytest.mark.parametrize("info", sorted(INFO_CAPTURES), ids=lambda p: p.name)
async def test_the_monitor_watches_every_published_chip_under_its_published_name(info):
    output = _output(info)
    published = await _published(output)
    view, _ = await _monitored(_with_health(output.info, None))
    assert published, "a capture without chips proves nothing"
    assert [o.device for o in view.devices] == published
    assert not any(o.fault or o.unknown for o in view.devices)


@pytest.mark.parametrize("word", ["Alarm", "Critical"])
@pytest.mark.parametrize("info", sorted(INFO_CAPTURES), ids=lambda p: p.name)
async def test_a_fault_on_each_chip_names_exactly_the_device_discovery_published(info, word):
    output = _output(info)
    published = await _published(output)
    for k, device in enumerate(published):
        view, runner = await _monitored(_with_health(output.info, k, word))
        faulty = [o.device for o in view.devices if o.fault is not None]
        assert faulty == [device], f"chip {k} of {info.name}"
        assert len(runner.health_queries) == 1  # asked about that one chip, by its card and chip


async def test_a_chips_fault_reaches_its_static_vnpus_so_every_published_device_is_watched():
    output = Output(
        (FIXTURES / "310p3-published.txt").read_text(), (FIXTURES / "310p3-topo.txt").read_text()
    )
    fake = FakeNpuSmi()
    fake.vnpus(7, 0, "310p3-info-vnpu-host.txt")
    fake.outputs[("info",)] = output.info
    fake.outputs[("info", "-t", "topo")] = output.topo
    scan = await ascend.AscendBackend(run_command=fake, sysfs=Sysfs("/nonexistent")).scan()
    identity = inventory.Identity(driver="npu.huawei.com", node="n1", pool="n1", backend="ascend")
    published = inventory.build(scan, identity=identity, scanned_unix_ms=1)
    view, _ = await _monitored(_with_health(output.info, 0))
    judged = attribution.attribute(view.devices, attribution.topology(published))
    assert {o.device for o in judged} == {d.name for d in published.devices}
    assert all(o.fault is not None for o in judged)  # npu-0 and both of its vNPUs


# Generated tables: any layout, any ids, any health.

_LAYOUTS = {
    "plain": ("Chip                      ", "910B3"),  # 910A/910B: device id = NPU id
    "Device": ("Chip  Device              ", "310P3"),  # 310/310P: the Device column
    "Phy-ID": ("Chip  Phy-ID              ", "Ascend910"),  # A3: the Phy-ID column
}


@st.composite
def tables(draw: st.DrawFn) -> tuple[str, list[tuple[int, int, int]], list[str]]:
    """(npu-smi info text, [(card, chip, device id)] in table order, health per chip)."""
    layout = draw(st.sampled_from(sorted(_LAYOUTS)))
    cards = draw(st.lists(st.integers(0, 31), min_size=1, max_size=8, unique=True))
    chips_per_card = 1 if layout == "plain" else draw(st.integers(1, 2))
    count = len(cards) * chips_per_card
    device_ids = (
        cards
        if layout == "plain"
        else draw(st.permutations(range(count + draw(st.integers(0, 8)))))[:count]
    )
    rows = [
        (card, chip, device_ids[k * chips_per_card + chip])
        for k, card in enumerate(cards)
        for chip in range(chips_per_card)
    ]
    health = [draw(st.sampled_from(["OK", "Warning", "Alarm", "Critical"])) for _ in rows]
    return _render(layout, rows, health), rows, health


def _render(layout: str, rows: list[tuple[int, int, int]], health: list[str]) -> str:
    second_header, name = _LAYOUTS[layout]
    bar = "+" + "-" * 27 + "+" + "-" * 15 + "+" + "-" * 52 + "+"
    lines = [
        "+" + "-" * 96 + "+",
        "| npu-smi 24.1.0                   Version: 24.1.0" + " " * 47 + "|",
        bar,
        "| NPU   Name                | Health        | Power(W)    Temp(C)           "
        "Hugepages-Usage(page)|",
        f"| {second_header}| Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |",
        "+" + "=" * 27 + "+" + "=" * 15 + "+" + "=" * 52 + "+",
    ]
    power = "180.5       38                0    / 0             "
    usage = "0           0    / 0          3120 / 65536         "
    for k, ((card, chip, device), word) in enumerate(zip(rows, health, strict=True)):
        ids = f"{chip}" if layout == "plain" else f"{chip:<6}{device}"
        lines += [
            f"| {card:<6}{name:<20}| {word:<14}| {power}|",
            f"| {ids:<26}| 0000:{k:02X}:00.0  | {usage}|",
            bar,
        ]
    return "\n".join(lines) + "\n"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_on_any_table_discovery_names_are_the_monitors_names(table):
    text, rows, health = table
    published = asyncio.run(_published(Output(text, _made_up_topo(text))))
    view, _ = asyncio.run(_monitored(text))
    assert [o.device for o in view.devices] == published
    assert published == [f"npu-{device}" for _, _, device in rows]
    for observation, word in zip(view.devices, health, strict=True):
        assert (observation.fault is not None) == (word != "OK")
