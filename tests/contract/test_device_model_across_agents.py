"""Contract (issue 22): on one node's backend state, discovery, the health monitor, the
allocation agent's container edits and the device-plugin front agree on every device.

For every captured state of every backend — the Ascend `npu-smi` captures (static vNPUs
included), fake-NVML nodes (whole GPUs, MIG devices that exist, MIG placements made on demand)
and every shipped sim profile — discovery's scan runs first, then:

1. health: the node's monitor on the same state watches exactly the published devices, under
   the published names, and a fault on each device (an npu-smi `Alarm`, an NVML XID on a GPU
   or on a MIG instance, a sim fault command) names exactly that device, and through the
   inventory's partition attribution (what the policy judges) its partitions too;
2. allocation: the container edits of a claim allocated that one device
   (`cdi.edits.claim_edits`, what `dra.planning` calls) hold only its own numbered device nodes
   (a MIG device: its parent's node and its own instance's capabilities) and visible-devices
   value, and `allowlist.check` accepts them bound to that device alone;
3. device-plugin front: `resources.resources` offers every published device that exists under
   exactly one extended resource, and that resource's `ListAndWatch` answer lists it with the
   published name as its ID; an option made on demand is offered under none.

What each monitor sees, decided from what it does:

- ascend: `npu-smi info` lists chips; a static vNPU is watched through its chip (`parent`).
- nvml: NVML lists GPUs. A MIG device that exists is named by the monitor itself when an XID
  names its GPU instance (`mig_partition`: the inventory's topology), and otherwise carries its
  GPU's state through attribution. An option made on demand (`createdOnDemand`) has no GPU
  instance, so no event can name it: it carries its GPU's state only, until the partition
  manager makes it; from then on discovery publishes it, under the same name, as a MIG device
  that exists, and an XID on its instance names it alone.
- sim: the monitor reports every inventory device as published, options included, and a fault
  command may name any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings

from services.allocation.cdi import allowlist
from services.allocation.cdi.edits import DEVICES_ENV, DeviceUse, claim_edits
from services.allocation.deviceplugin import resources
from services.allocation.deviceplugin.catalog import DeviceCatalog
from services.allocation.deviceplugin.service import DevicePluginService
from services.allocation.node_view.health_board import HealthBoard
from services.allocation.node_view.inventory_cache import InventoryCache
from services.discovery import inventory
from services.health import attribution
from shared.bus import codec, kv
from shared.bus.connection import Bus
from shared.bus.kv import KVChange
from shared.config import NATSSettings
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2
from shared.sim import profile
from shared.vendors import registry
from shared.vendors.ascend import discovery as ascend
from shared.vendors.ascend.cdi import CONTROL_NODES as ASCEND_CONTROL_NODES
from shared.vendors.nvidia import discovery as nvml
from shared.vendors.nvidia.cdi import CONTROL_NODES as NVIDIA_CONTROL_NODES
from shared.vendors.nvidia.monitor import NvmlMonitor
from shared.vendors.nvidia.partitions import MigPartitionManager
from shared.vendors.parts.discovery import Scan
from shared.vendors.parts.observation import Observation, Observations
from shared.vendors.parts.partitions import Partition, on_demand_option
from shared.vendors.parts.sysfs import Sysfs
from shared.vendors.sim import monitor as sim_monitor
from shared.vendors.sim.discovery import SimBackend
from shared.vendors.sim.partitions import SimPartitionManager
from tests.contract.test_ascend_device_names import (
    INFO_CAPTURES,
    Output,
    _made_up_topo,
    _monitored,
    _output,
    _with_health,
    tables,
)
from tests.fakes.npusmi import FIXTURES, FakeNpuSmi
from tests.fakes.nvml import MODELS, FakeNVML
from tests.fakes.nvml_events import FakeNVMLEvents
from tests.fakes.nvml_mig import FakeMigNVML, cap_minor

UID = "c0ffee00-0000-4000-8000-000000000022"
NODE = "n1"
DRIVERS = {"ascend": "npu.huawei.com", "nvml": "gpu.dra-suite.io", "sim": "sim.dra-suite.io"}
CONTROL_NODES: Mapping[str, tuple[str, ...]] = {
    "ascend": ASCEND_CONTROL_NODES,
    "nvml": NVIDIA_CONTROL_NODES,
    "sim": (),
}
NUMBERED = re.compile(r"/dev/(davinci|nvidia)[0-9]+|/dev/nvidia-caps/nvidia-cap[0-9]+")
"""Device nodes that name one device (a chip, a GPU, a MIG instance's capability)."""
SIM_HOST = "/dev/null"
XID = 79  # fell off the bus: a fault the policy never ignores

NodeEdit = tuple[str, str]


# --- what every backend is held to ---------------------------------------------------------


def _inventory(scan: Scan, backend: str) -> inventory_pb2.Inventory:
    """What the discovery agent publishes for `scan` (sorted by name, as `inventory.build`)."""
    identity = inventory.Identity(driver=DRIVERS[backend], node=NODE, pool=NODE, backend=backend)
    return inventory.build(scan, identity=identity, scanned_unix_ms=1)


def _on_demand(device: inventory_pb2.Device) -> bool:
    return on_demand_option(device, claim_uid=UID) is not None


def _partitions(published: inventory_pb2.Inventory, parent: str) -> set[str]:
    return {d.name for d in published.devices if d.parent == parent}


def _faulty(observations: Iterable[Observation]) -> set[str]:
    return {o.device for o in observations if o.fault is not None or o.unknown}


def _judged(view: Observations, published: inventory_pb2.Inventory) -> tuple[Observation, ...]:
    """The view the health policy judges: partitions carry their parent's state."""
    return attribution.attribute(view.devices, attribution.topology(published))


def _assert_all_watched(view: Observations, published: inventory_pb2.Inventory) -> None:
    """Every published device is judged, under its published name, and nothing else; all well."""
    judged = _judged(view, published)
    assert sorted(o.device for o in judged) == sorted(d.name for d in published.devices)
    assert _faulty(judged) == set()


def _assert_fault_names(
    view: Observations,
    published: inventory_pb2.Inventory,
    device: str,
    *,
    reported: set[str],
) -> None:
    """The monitor names exactly `reported`; the policy's view `device` and its partitions."""
    assert _faulty(view.devices) == reported, device
    wanted = {device} | _partitions(published, device)
    assert _faulty(_judged(view, published)) == wanted, device


@dataclass(frozen=True, slots=True)
class Bound:
    """What a claim of one device may hand its container: that device's numbered nodes (path,
    host path) and its visible-devices variables."""

    nodes: tuple[NodeEdit, ...]
    visible: Mapping[str, str]


def _assert_edits_bound(
    backend: str,
    device: inventory_pb2.Device,
    bound: Bound,
    *,
    partition: Partition | None = None,
) -> None:
    use = DeviceUse(request="only", device=device, partition=partition)
    built = claim_edits(backend=backend, claim_uid=UID, uses=[use], configs={})
    [cdi] = built.devices
    every = [*cdi.device_nodes, *built.common_nodes]
    numbered = sorted(node for node in every if NUMBERED.fullmatch(node[0]))
    assert numbered == sorted(bound.nodes), device.name
    others = {path for path, _ in every if not NUMBERED.fullmatch(path)}
    assert others <= set(CONTROL_NODES[backend]), device.name
    visible = {k: v for k, v in cdi.env.items() if k in allowlist.VISIBLE_ENV}
    assert visible == dict(bound.visible), device.name
    assert cdi.env[DEVICES_ENV] == device.name
    own = allowlist.Own(
        nodes=frozenset(path for path, _ in bound.nodes),
        visible=frozenset(f"{name}={value}" for name, value in bound.visible.items()),
    )
    edits = allowlist.DeviceEdits(device=device.name, nodes=every, env=cdi.env, own=own)
    allowlist.check(backend=backend, claim_uid=UID, devices=[edits])


async def _assert_offered(
    published: inventory_pb2.Inventory, expected: Mapping[str, str | None], state: Path
) -> None:
    """Each device under exactly its `expected` resource (None: none), and each resource's
    ListAndWatch lists its devices by their published names."""
    backend, driver = published.backend, published.driver
    assert set(expected) == {d.name for d in published.devices}
    offered = resources.resources(published, backend=backend, driver=driver, overrides={})
    holders: dict[str, list[str]] = {}
    for resource in offered.values():
        for device in resource.devices:
            holders.setdefault(device.name, []).append(resource.name)
    for name, wanted in expected.items():
        if wanted is None:
            assert name not in holders, name
        else:
            assert len(holders.get(name, [])) == 1, (name, holders.get(name))
            assert holders[name] == [wanted], name

    cache = InventoryCache(state / "inventory.pb", driver=driver, node=NODE, backend=backend)
    assert await cache.update(published)
    catalog = DeviceCatalog(cache, driver=driver, backend=backend, overrides={})
    board = HealthBoard(pool=NODE)
    for resource in offered.values():
        plugin = DevicePluginService(resource=resource.name, catalog=catalog, board=board)
        listed = [d.ID for d in plugin.device_list().devices]
        assert listed == [d.name for d in resource.devices], resource.name


# --- Ascend: npu-smi captures ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AscendNode:
    """A captured `npu-smi info` (with its topo) and the chips' captured vNPU views."""

    info: Path
    vnpus: tuple[tuple[int, int, str], ...] = ()
    """(card, chip, `npu-smi info -t info-vnpu` fixture)."""

    @property
    def id(self) -> str:
        return self.info.name + ("+vnpus" if self.vnpus else "")


ASCEND_NODES = [
    *(AscendNode(info) for info in sorted(INFO_CAPTURES)),
    AscendNode(FIXTURES / "310p3-published.txt", vnpus=((7, 0, "310p3-info-vnpu-host.txt"),)),
]


async def _ascend_scan(output: Output, node: AscendNode | None = None) -> Scan:
    fake = FakeNpuSmi()
    fake.outputs[("info",)] = output.info
    fake.outputs[("info", "-t", "topo")] = output.topo
    for card, chip, fixture in node.vnpus if node is not None else ():
        fake.vnpus(card, chip, fixture)
    return await ascend.AscendBackend(run_command=fake, sysfs=Sysfs("/nonexistent")).scan()


def _ascend_bound(device: inventory_pb2.Device) -> Bound:
    """`/dev/davinci<id>` (a vNPU's: host `/dev/vdavinci<id>`), `ASCEND_VISIBLE_DEVICES=<id>`."""
    index = device.attributes["index"].int
    virtual = "vir" in device.attributes["chipName"].string
    node = (f"/dev/davinci{index}", f"/dev/vdavinci{index}" if virtual else "")
    return Bound(nodes=(node,), visible={"ASCEND_VISIBLE_DEVICES": str(index)})


def _ascend_resource(device: inventory_pb2.Device) -> str | None:
    """The Ascend device plugin's resource: the chip family, a vNPU's `-<AI cores>c`."""
    chip = device.attributes["chipName"].string.removeprefix("Ascend")
    family = "310P" if chip.startswith("310P") else "310" if chip.startswith("310") else "910"
    template = re.search(r"vir([0-9]+)$", chip)
    suffix = f"-{int(template.group(1))}c" if template is not None else ""
    return f"huawei.com/Ascend{family}{suffix}"


async def _ascend_published(node: AscendNode) -> tuple[Output, list[str], inventory_pb2.Inventory]:
    """The node's npu-smi output, its chips' names in table order, and the inventory."""
    output = _output(node.info)
    scan = await _ascend_scan(output, node)
    chips = [d.name for d in scan.devices if not d.parent]
    assert chips, "a capture without chips proves nothing"
    published = _inventory(scan, "ascend")
    assert bool(node.vnpus) == any(d.parent for d in published.devices)
    return output, chips, published


@pytest.mark.parametrize("node", ASCEND_NODES, ids=lambda n: n.id)
async def test_ascend_the_monitor_watches_every_device_and_a_chips_alarm_names_it(node):
    output, chips, published = await _ascend_published(node)
    view, _ = await _monitored(_with_health(output.info, None))
    assert [o.device for o in view.devices] == chips
    _assert_all_watched(view, published)
    for k, chip in enumerate(chips):
        view, runner = await _monitored(_with_health(output.info, k))
        _assert_fault_names(view, published, chip, reported={chip})
        assert len(runner.health_queries) == 1


@pytest.mark.parametrize("node", ASCEND_NODES, ids=lambda n: n.id)
async def test_ascend_the_edits_of_each_device_are_its_own(node):
    _, _, published = await _ascend_published(node)
    for device in published.devices:
        if _on_demand(device):  # a vNPU made at prepare: its edits come with its partition
            with pytest.raises(ClaimError, match="is made at prepare"):
                claim_edits(
                    backend="ascend",
                    claim_uid=UID,
                    uses=[DeviceUse(request="only", device=device)],
                    configs={},
                )
            continue
        _assert_edits_bound("ascend", device, _ascend_bound(device))


@pytest.mark.parametrize("node", ASCEND_NODES, ids=lambda n: n.id)
async def test_ascend_the_front_offers_each_device_once_by_its_name(node, tmp_path):
    _, _, published = await _ascend_published(node)
    expected = {d.name: None if _on_demand(d) else _ascend_resource(d) for d in published.devices}
    await _assert_offered(published, expected, tmp_path)


# --- NVML: fake NVML nodes, with MIG ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NvmlNode:
    """A fake NVML node: its GPUs, the MIG devices an admin made, the profiles discovery offers."""

    id: str
    model: str
    count: int
    nvlink: Literal["nvswitch", "pairs", "none"] = "nvswitch"
    mig_enabled: bool = False
    mig_profiles: tuple[str, ...] = ()
    made: tuple[tuple[int, int, int], ...] = ()
    """MIG devices that exist: (GPU index, GI profile ID, placement start)."""

    def fake(self) -> FakeNVML:
        fake = FakeNVML.node(
            self.model, count=self.count, nvlink=self.nvlink, mig_enabled=self.mig_enabled
        )
        for index, profile_id, start in self.made:
            fake.make_mig_device(index, profile_id, start)
        return fake


NVML_NODES = [
    NvmlNode("h100-x8-whole-gpus", "H100-80GB", 8),
    NvmlNode("l4-x2-no-mig", "L4", 2, nvlink="none", mig_profiles=("1g.10gb",)),
    NvmlNode(
        "a100-x2-options-only",
        "A100-80GB",
        2,
        nvlink="pairs",
        mig_enabled=True,
        mig_profiles=("1g.10gb", "3g.40gb"),
    ),
    NvmlNode(
        "h100-x2-mig-devices-and-options",
        "H100-80GB",
        2,
        mig_enabled=True,
        mig_profiles=("1g.10gb", "1g.10gb+me", "2g.20gb", "3g.40gb", "7g.80gb"),
        made=((1, 9, 4), (1, 19, 0), (0, 14, 2)),
    ),
    NvmlNode(
        "h200-x1-mig-devices-only", "H200-141GB", 1, mig_enabled=True, made=((0, 19, 6), (0, 15, 0))
    ),
    # Hopper offers its placements whatever the MIG mode; preparing one fails until MIG is on
    # (docs/partitions.md).
    NvmlNode("h100-x1-mig-off-options", "H100-80GB", 1, mig_profiles=("3g.40gb", "7g.80gb")),
    # A MIG device of a media-extension profile (`1g.10gb+me`, GI profile 20) that exists.
    NvmlNode(
        "a100-x1-me-mig-device",
        "A100-80GB",
        1,
        mig_enabled=True,
        mig_profiles=("1g.10gb",),
        made=((0, 20, 0), (0, 9, 4)),
    ),
]


def _front_params(nodes: Sequence[NvmlNode]) -> list[object]:
    return [pytest.param(n, id=n.id) for n in nodes]


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG device that exists on the fake: GPU index, GPU and compute instance IDs, GI profile
    and placement start, and its UUID."""

    gpu: int
    gi: int
    ci: int
    profile_id: int
    start: int
    uuid: str


def _instances(fake: FakeNVML) -> list[MigInstance]:
    return [
        MigInstance(gpu.index, gi.id, ci, gi.profile_id, gi.placement.start, gi.uuids[ci])
        for gpu in fake.gpus
        for gi in fake.instances[gpu.index].values()
        for ci in gi.cis
    ]


async def _nvml_inventory(node: NvmlNode, fake: FakeNVML) -> inventory_pb2.Inventory:
    options = nvml.NvmlOptions(mig_profiles=node.mig_profiles)
    backend = nvml.NvmlBackend.open(fake, options=options, sysfs=Sysfs("/nonexistent"))
    return _inventory(await backend.scan(), "nvml")


def _events_of(fake: FakeNVML) -> FakeNVMLEvents:
    """The health monitor's NVML on the same node: the same GPUs and GPU instances."""
    events = FakeNVMLEvents(count=len(fake.gpus))
    for gpu, seen in zip(fake.gpus, events.gpus, strict=True):
        seen.uuid = gpu.uuid
        for gi in fake.instances[gpu.index].values():
            events.add_gpu_instance(
                gpu.index,
                gi.id,
                profile_id=gi.profile_id,
                start=gi.placement.start,
                size=gi.placement.size,
            )
    events.init()
    return events


def _by_uuid(published: inventory_pb2.Inventory) -> dict[str, str]:
    return {d.uuid: d.name for d in published.devices if d.uuid}


class Sink:
    """An `ObservationSink` a test can wait on."""

    def __init__(self) -> None:
        self.views: list[Observations] = []
        self.news = asyncio.Event()

    def __call__(self, view: Observations) -> None:
        self.views.append(view)
        self.news.set()

    async def until(self, check: Callable[[Observations], bool]) -> Observations:
        async with asyncio.timeout(5):
            while not (self.views and check(self.views[-1])):
                self.news.clear()
                await self.news.wait()
        return self.views[-1]


async def _nvml_view(
    fake: FakeNVML,
    published: inventory_pb2.Inventory,
    inject: Callable[[FakeNVMLEvents], None] | None = None,
) -> Observations:
    """The nvml monitor's view of the node, after `inject` (an event) was seen."""
    events = _events_of(fake)
    instances = attribution.topology(published).gpu_instances
    monitor = NvmlMonitor(
        events,
        pool=NODE,
        wait_ms=10,
        counters_s=3600.0,
        refresh_s=3600.0,
        mig_partition=lambda gpu, profile_id, start: instances.get((gpu, profile_id, start)),
    )
    sink = Sink()
    task = asyncio.create_task(monitor.run(sink))
    try:
        await sink.until(lambda _: True)
        if inject is None:
            return sink.views[-1]
        inject(events)
        return await sink.until(lambda view: bool(_faulty(view.devices)))
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _xid(index: int, gpu_instance: int | None = None) -> Callable[[FakeNVMLEvents], None]:
    def inject(events: FakeNVMLEvents) -> None:
        if gpu_instance is None:
            events.xid(index, XID)
        else:
            events.xid(index, XID, gpu_instance=gpu_instance, compute_instance=0)

    return inject


def _nvml_bound(fake: FakeNVML, device: inventory_pb2.Device, mig: MigInstance | None) -> Bound:
    """A GPU: `/dev/nvidia<minor>` and its UUID; a MIG device: its parent's node, its own GI's
    and CI's capabilities, its MIG UUID."""
    if mig is None:
        gpu = next(g for g in fake.gpus if g.uuid == device.uuid)
        return Bound(
            nodes=((f"/dev/nvidia{gpu.index}", ""),), visible={"NVIDIA_VISIBLE_DEVICES": gpu.uuid}
        )
    caps = (cap_minor(mig.gpu, mig.gi), cap_minor(mig.gpu, mig.gi, mig.ci))
    return Bound(
        nodes=(
            (f"/dev/nvidia{mig.gpu}", ""),
            *((f"/dev/nvidia-caps/nvidia-cap{minor}", "") for minor in caps),
        ),
        visible={"NVIDIA_VISIBLE_DEVICES": mig.uuid},
    )


def _nvml_resource(fake: FakeNVML, device: inventory_pb2.Device) -> str | None:
    if _on_demand(device):
        return None  # a device plugin hands out only what exists
    if device.kind == "gpu":
        return "nvidia.com/gpu"
    mig = next(m for m in _instances(fake) if m.uuid == device.uuid)
    name = fake.gpus[mig.gpu].model.profile(mig.profile_id).name.removeprefix("MIG ")
    # `+` is no character of a resource name: a `+me` profile counts as its plain profile, as
    # in NVIDIA's device plugin.
    return f"nvidia.com/mig-{name.partition('+')[0]}"


def _published_name(published: inventory_pb2.Inventory, gpus: list[str], mig: MigInstance) -> str:
    """The device a MIG device is published as: by its UUID (a profile the node does not
    offer), else the option of its slot (an offered profile's slot stays its option)."""
    names = _by_uuid(published)
    if mig.uuid in names:
        return names[mig.uuid]
    [slot] = [
        d.name
        for d in published.devices
        if _on_demand(d)
        and d.parent == gpus[mig.gpu]
        and d.name.endswith(f"-{mig.profile_id}-{mig.start}")
    ]
    return slot


@dataclass(frozen=True, slots=True)
class NvmlPublished:
    """A fake NVML node after discovery's scan, each device sorted by what it is."""

    fake: FakeNVML
    inventory: inventory_pb2.Inventory
    gpus: list[str]
    """The GPUs' published names, by NVML index."""
    existing: dict[str, MigInstance]
    """MIG devices that exist, by published name (an offered profile's: its slot's option)."""
    options: set[str]
    """Options made on demand."""


async def _nvml_published(node: NvmlNode) -> NvmlPublished:
    fake = node.fake()
    published = await _nvml_inventory(node, fake)
    names = _by_uuid(published)
    gpus = [names[gpu.uuid] for gpu in fake.gpus]
    options = {d.name for d in published.devices if _on_demand(d)}
    existing = {_published_name(published, gpus, m): m for m in _instances(fake)}
    assert {d.name for d in published.devices} == {*gpus, *existing, *options}
    assert len(existing) == len(node.made)
    assert all(d.kind == "mig" and d.parent for d in published.devices if d.name in options)
    return NvmlPublished(fake, published, gpus, existing, options)


@pytest.mark.parametrize("node", NVML_NODES, ids=lambda n: n.id)
async def test_nvml_the_monitor_watches_every_device_and_an_xid_names_it(node):
    """NVML lists the GPUs, which the policy's view extends to every MIG slot; an XID on a GPU
    is its and its slots', an XID on a MIG instance that MIG device's alone."""
    found = await _nvml_published(node)
    fake, published = found.fake, found.inventory
    view = await _nvml_view(fake, published)
    assert [o.device for o in view.devices] == found.gpus
    _assert_all_watched(view, published)
    for index, gpu in enumerate(found.gpus):
        view = await _nvml_view(fake, published, _xid(index))
        _assert_fault_names(view, published, gpu, reported={gpu})
    for name, mig in found.existing.items():
        view = await _nvml_view(fake, published, _xid(mig.gpu, mig.gi))
        _assert_fault_names(view, published, name, reported={name})


@pytest.mark.parametrize("node", NVML_NODES, ids=lambda n: n.id)
async def test_nvml_the_edits_of_each_device_that_exists_are_its_own(node):
    """A GPU's and an existing MIG device's edits are its own; an option not made yet gets
    none (never the whole GPU): its edits come with its partition (the test below)."""
    found = await _nvml_published(node)
    for device in found.inventory.devices:
        if device.name in found.options:
            with pytest.raises(ClaimError, match="does not exist yet"):
                claim_edits(
                    backend="nvml",
                    claim_uid=UID,
                    uses=[DeviceUse(request="only", device=device)],
                    configs={},
                )
            continue
        bound = _nvml_bound(found.fake, device, found.existing.get(device.name))
        _assert_edits_bound("nvml", device, bound)


@pytest.mark.parametrize("node", _front_params(NVML_NODES))
async def test_nvml_the_front_offers_each_device_that_exists_once_by_its_name(node, tmp_path):
    found = await _nvml_published(node)
    expected = {d.name: _nvml_resource(found.fake, d) for d in found.inventory.devices}
    await _assert_offered(found.inventory, expected, tmp_path)


@pytest.mark.parametrize(
    "node", [n for n in NVML_NODES if n.mig_profiles and MODELS[n.model].names], ids=lambda n: n.id
)
async def test_nvml_an_option_made_on_demand_is_bound_to_its_mig_device_then_watched(
    node, tmp_path
):
    """Each option, made by the MIG partition manager on the same fake NVML as when a claim that
    got it is prepared: the edits are the new MIG device's; discovery's next scan publishes the
    option unchanged (no UUID), and an XID on its instance names it alone. Each is
    removed before the next (options overlap)."""
    found = await _nvml_published(node)
    fake, published = found.fake, found.inventory
    by_name = {d.name: d for d in published.devices}
    names = _by_uuid(published)
    caps = tmp_path / "capabilities"
    mig_nvml = FakeMigNVML(nvml=fake, capabilities_root=caps)
    manager = MigPartitionManager(
        tmp_path / "mig-partitions.json", open_library=lambda: mig_nvml, capabilities_root=caps
    )
    before = _instances(fake)
    for device in published.devices:
        option = on_demand_option(device, claim_uid=UID)
        if option is None or device.name in found.existing:
            # A slot that holds an admin's MIG device is handed over as it is
            # (tests/unit/allocation/test_mig_partitions.py).
            continue
        make = manager.create(
            claim_uid=UID,
            device=by_name[option.parent],
            profile=option.profile,
            placement=option.placement,
        )
        if not node.mig_enabled:
            with pytest.raises(ClaimError, match="MIG mode is not enabled"):
                await make
            assert _instances(fake) == before
            continue
        partition = await make
        [made] = [m for m in _instances(fake) if m not in before]
        assert (names[fake.gpus[made.gpu].uuid], made.start) == (option.parent, option.placement)
        assert partition.id == made.uuid
        _assert_edits_bound("nvml", device, _nvml_bound(fake, device, made), partition=partition)

        now = await _nvml_inventory(node, fake)
        [now_device] = [d for d in now.devices if d.name == device.name]
        # The slot stays the option it was allocated as: the UUID is the claim's, not the slice's.
        assert (now_device.uuid, _on_demand(now_device)) == ("", True)
        view = await _nvml_view(fake, now, _xid(made.gpu, made.gi))
        _assert_fault_names(view, now, device.name, reported={device.name})

        await manager.delete_claim(UID)
        assert _instances(fake) == before
    assert found.options, "a node without options proves nothing here"


# --- sim: every shipped profile --------------------------------------------------------------


SIM_PROFILES = sorted(p.stem for p in profile.PROFILES_DIR.glob("*.yaml"))


class Reply:
    """A NATS request for `SimMonitor.handle_command`."""

    def __init__(self, command: health_pb2.FaultCommand) -> None:
        self.data = codec.encode(command)
        self.headers: dict[str, str] | None = None
        self.answers: list[bytes] = []

    async def respond(self, data: bytes) -> None:
        self.answers.append(data)


@contextlib.asynccontextmanager
async def _sim_monitor(
    published: inventory_pb2.Inventory, patch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[sim_monitor.SimMonitor, Sink]]:
    """The sim monitor, its inventory watch answered by `published` (as the KV would)."""

    async def watch(
        bus: Bus, *, bucket: str, keys: str, purpose: str = "watch", rejected: bool = False
    ) -> AsyncIterator[KVChange]:
        yield KVChange(key=keys, value=codec.encode(published), revision=1)
        await asyncio.Event().wait()

    patch.setattr(kv, "watch", watch)  # the monitor's inventory watch
    bus = Bus(NATSSettings(url="nats://127.0.0.1:1"), name="contract")  # never connected
    monitor = sim_monitor.SimMonitor(
        bus, driver=published.driver, node=NODE, faults=(), refresh_s=3600.0
    )
    sink = Sink()
    task = asyncio.create_task(monitor.run(sink))
    try:
        await sink.until(lambda _: True)
        yield monitor, sink
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _command(monitor: sim_monitor.SimMonitor, device: str, *, clear: bool = False) -> None:
    request = Reply(health_pb2.FaultCommand(device=device, clear=clear, cause="injected"))
    await monitor.handle_command(request)
    assert request.answers == [b'{"ok": true}']


def _sim_bound(device: inventory_pb2.Device) -> Bound:
    index = device.attributes["index"].int
    if device.kind == "npu":
        return Bound(
            nodes=((f"/dev/davinci{index}", SIM_HOST),),
            visible={"ASCEND_VISIBLE_DEVICES": str(index)},
        )
    return Bound(
        nodes=((f"/dev/nvidia{index}", SIM_HOST),), visible={"NVIDIA_VISIBLE_DEVICES": str(index)}
    )


def _sim_partition_bound(parent: inventory_pb2.Device, partition: Partition) -> Bound:
    """The parent GPU's node and the capabilities of GPU instance 0 of it (the sim's first
    slot), all on /dev/null; the MIG UUID made for the claim."""
    index = parent.attributes["index"].int
    caps = (cap_minor(index, 0), cap_minor(index, 0, 0))
    return Bound(
        nodes=(
            (f"/dev/nvidia{index}", SIM_HOST),
            *((f"/dev/nvidia-caps/nvidia-cap{minor}", SIM_HOST) for minor in caps),
        ),
        visible={"NVIDIA_VISIBLE_DEVICES": partition.id},
    )


def _sim_resource(device: inventory_pb2.Device) -> str | None:
    return None if _on_demand(device) else f"{DRIVERS['sim']}/{device.kind}"


async def _sim_published(name: str) -> inventory_pb2.Inventory:
    published = _inventory(await SimBackend.from_profile(name).scan(), "sim")
    assert published.devices
    return published


@pytest.mark.parametrize("name", SIM_PROFILES)
async def test_sim_the_monitor_watches_every_device_and_a_fault_names_it(name, monkeypatch):
    """The sim monitor reports the inventory as published, options included; a fault command
    on a device names it (and, in the policy's view, its partitions)."""
    published = await _sim_published(name)
    async with _sim_monitor(published, monkeypatch) as (monitor, sink):
        view = sink.views[-1]
        assert [o.device for o in view.devices] == [d.name for d in published.devices]
        _assert_all_watched(view, published)
        for device in published.devices:
            await _command(monitor, device.name)
            _assert_fault_names(sink.views[-1], published, device.name, reported={device.name})
            await _command(monitor, device.name, clear=True)
            assert _faulty(sink.views[-1].devices) == set()


@pytest.mark.parametrize("name", SIM_PROFILES)
async def test_sim_the_edits_of_each_device_are_its_own(name, tmp_path):
    """A device as published; an option with the partition the sim manager makes for it at
    its placement (removed before the next: options overlap)."""
    published = await _sim_published(name)
    by_name = {d.name: d for d in published.devices}
    manager = SimPartitionManager(tmp_path / "sim-partitions.json")
    for device in published.devices:
        option = on_demand_option(device, claim_uid=UID)
        if option is None:
            _assert_edits_bound("sim", device, _sim_bound(device))
            continue
        parent = by_name[option.parent]
        partition = await manager.create(
            claim_uid=UID, device=parent, profile=option.profile, placement=option.placement
        )
        bound = _sim_partition_bound(parent, partition)
        _assert_edits_bound("sim", device, bound, partition=partition)
        assert await manager.delete_claim(UID) == [partition]


@pytest.mark.parametrize("name", SIM_PROFILES)
async def test_sim_the_front_offers_each_device_that_exists_once_by_its_name(name, tmp_path):
    published = await _sim_published(name)
    expected = {d.name: _sim_resource(d) for d in published.devices}
    await _assert_offered(published, expected, tmp_path)


def test_every_backend_capture_and_fake_gpu_model_is_in_this_contract():
    assert set(DRIVERS) == set(CONTROL_NODES) == set(registry.NAMES)
    assert {n.info for n in ASCEND_NODES} == set(INFO_CAPTURES)
    assert {n.model for n in NVML_NODES} == set(MODELS)


# --- generated npu-smi tables (hypothesis) ---------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_on_any_npu_smi_table_every_agent_agrees_on_every_chip(table):
    text, rows, health = table
    names = [f"npu-{device}" for _, _, device in rows]

    async def check() -> None:
        scan = await _ascend_scan(Output(text, _made_up_topo(text)))
        published = _inventory(scan, "ascend")
        assert [d.name for d in scan.devices] == names
        view, _ = await _monitored(text)
        assert [o.device for o in view.devices] == names
        faulty = {name for name, word in zip(names, health, strict=True) if word != "OK"}
        assert _faulty(_judged(view, published)) == faulty
        for device in published.devices:
            _assert_edits_bound("ascend", device, _ascend_bound(device))
        expected = {
            d.name: None if _on_demand(d) else _ascend_resource(d) for d in published.devices
        }
        with tempfile.TemporaryDirectory() as state:
            await _assert_offered(published, expected, Path(state))

    asyncio.run(check())
