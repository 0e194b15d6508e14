"""The Ascend backend: Huawei NPUs from `npu-smi info`, `-t topo` and each chip's `-t info-vnpu`.

Each chip becomes a device named `npu-<id>` (`shared.vendors.ascend.devices.device_name`, the
name every agent uses for it) with the attributes of the sim profile, so the same
DeviceClasses and CEL work on both: `type` ("npu"), `chipName`, `index`, `physicalId`,
`cardId` and `chipId` (the NPU ID and Chip ID columns: the card, and the chip on it, so that
a claim can ask for chips of one card), `numaNode` (sysfs), `topologyGroup` (HCCS domain
from the topo matrix),
`resource.kubernetes.io/pcieRoot` (sysfs), capacity `memCapacity` and `aiCore`. Device nodes
are `/dev/davinci<id>` and the shared control nodes; the container gets
`ASCEND_VISIBLE_DEVICES=<id>` (docs/hardware.md §3.5).

Static vNPUs are read from the host's view of each chip (`npu-smi info -t info-vnpu -i <card>
-c <chip>`, docs/hardware.md §3.6): each is a device `npu-<id>-vnpu-<vNPU id>` with `parent`
the chip, `chipName` the chip's name and the template (`310P3vir02`, which the template
DeviceClasses and the device-plugin front read), `vnpuTemplate`, capacity `aiCore` (and
`memCapacity` where the template names it), host `/dev/vdavinci<vNPU id>` as
`/dev/davinci<vNPU id>` and `ASCEND_RUNTIME_OPTIONS=VIRTUAL`. A chip with vNPUs gets a counter
set of its AI cores: the chip consumes all of it and each vNPU its template's share, so the
scheduler never allocates a chip and a vNPU of it together (`shared.vendors.ascend.devices`).
A chip or npu-smi build without the vNPU view (the query fails, or prints no vNPU table) has no
static vNPUs.

A chip with the vNPU view whose model has templates (`shared.vendors.ascend.devices.TEMPLATES`)
is also published with options made at prepare: `npu-<id>-vnpu-<template>-<k>`, flagged
`createdOnDemand`, with `profile` and `vnpuTemplate` the template, consuming its cores of the
chip's counter set. The allocation agent makes the vNPU when a claim that got one is prepared,
under an id of the chip's upper half, and destroys it at unprepare; discovery never publishes
a vNPU under those ids as a static one, so what it publishes does not change with a claim.

Output that does not parse fails the scan with BackendUnavailableError, and the scanner keeps
the last good inventory.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence

from shared import quantity
from shared.commands import CommandFailedError, CommandRunner
from shared.errors import BackendUnavailableError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.ascend import devices as model
from shared.vendors.ascend.devices import AI_CORES, ai_cores
from shared.vendors.ascend.npusmi import (
    NpuChip,
    NpuSmiError,
    Topology,
    VnpuListing,
    hccs_links,
    parse_info,
    parse_topo,
    parse_vnpu_view,
)
from shared.vendors.parts import topology
from shared.vendors.parts.discovery import Scan
from shared.vendors.parts.sysfs import Sysfs, vfio_attributes
from shared.vfio.pci import Viability

ON_DEMAND = "createdOnDemand"
"""Bool attribute of a vNPU made at prepare time (as the MIG options of `mig.ON_DEMAND`)."""

__all__ = [
    "AI_CORES",
    "CONTROL_NODES",
    "AscendBackend",
    "PciFacts",
    "VnpuViews",
    "ai_cores",
    "hccs_groups",
    "to_scan",
]

CONTROL_NODES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
_MEMORY = re.compile(r"_(\d+)g(?:_|$)")

PciFacts = dict[str, tuple[str | None, int | None]]
"""Bus id -> (PCIe root, NUMA node), from sysfs."""
VnpuViews = Mapping[tuple[int, int], VnpuListing | None]
"""(card, chip) -> the chip's `npu-smi info -t info-vnpu`; None where it has no such view."""


def hccs_groups(topo: Topology) -> dict[int, str]:
    """Topo id -> `hccs-ring-<k>`: connected components of HCCS links (910A: two rings of 4)."""
    return topology.groups(topo.ids, hccs_links(topo), prefix="hccs-ring-")


def _topology_keys(chips: Sequence[NpuChip], topo: Topology) -> dict[int, int]:
    """Topo id -> device id: topo labels are device ids, or card ids with one chip per card."""
    by_device = {chip.device_id: chip.device_id for chip in chips}
    if set(topo.ids) == set(by_device):
        return by_device
    by_card = {chip.npu_id: chip.device_id for chip in chips}
    if len(by_card) == len(chips) and set(topo.ids) == set(by_card):
        return by_card
    raise NpuSmiError(
        f"npu-smi topo lists chips {sorted(topo.ids)}, npu-smi info {sorted(by_device)}"
    )


def _device(
    chip: NpuChip, *, name: str, group: str | None, facts: tuple[str | None, int | None]
) -> inventory_pb2.Device:
    device_id = chip.device_id
    device = inventory_pb2.Device(
        name=name,
        kind="npu",
        capacity={"memCapacity": quantity.mebibytes(chip.memory_mb)},
        device_nodes=[
            inventory_pb2.DeviceNode(path=path)
            for path in (f"/dev/davinci{device_id}", *CONTROL_NODES)
        ],
        env={"ASCEND_VISIBLE_DEVICES": str(device_id)},
    )
    if (cores := ai_cores(chip.name)) is not None:
        device.capacity["aiCore"] = str(cores)
    pcie_root, numa_node = facts
    attributes = device.attributes
    attributes["type"].string = "npu"
    attributes["chipName"].string = chip.name
    attributes["index"].int = device_id
    attributes["physicalId"].int = chip.phy_id if chip.phy_id is not None else device_id
    attributes["cardId"].int = chip.npu_id
    attributes["chipId"].int = chip.chip_id
    if numa_node is not None:
        attributes["numaNode"].int = numa_node
    if group is not None:
        attributes["topologyGroup"].string = group
    if pcie_root is not None:
        attributes["resource.kubernetes.io/pcieRoot"].string = pcie_root
    return device


def _vnpu(
    whole: inventory_pb2.Device,
    chip: NpuChip,
    vnpu_id: int,
    template: str,
    *,
    counters: inventory_pb2.CounterSet,
    total: int,
) -> inventory_pb2.Device:
    """The static vNPU `vnpu_id` of `chip` (its device `whole`), consuming its share."""
    device = inventory_pb2.Device(
        name=model.vnpu_name(chip, vnpu_id),
        kind="npu",
        parent=whole.name,
        device_nodes=[
            inventory_pb2.DeviceNode(
                path=f"/dev/davinci{vnpu_id}", host_path=f"/dev/vdavinci{vnpu_id}"
            ),
            *(inventory_pb2.DeviceNode(path=path) for path in CONTROL_NODES),
        ],
        env={"ASCEND_VISIBLE_DEVICES": str(vnpu_id), "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"},
    )
    for key, value in whole.attributes.items():
        device.attributes[key].CopyFrom(value)
    device.attributes["chipName"].string = f"{chip.name}{template}"
    device.attributes["index"].int = vnpu_id
    device.attributes["vnpuTemplate"].string = template
    consumption = model.vnpu_consumption(template, total=total)
    device.capacity["aiCore"] = consumption[model.AI_CORE_COUNTER]
    if (memory := _MEMORY.search(template)) is not None:
        device.capacity["memCapacity"] = f"{int(memory.group(1))}Gi"
    device.consumes_counters.append(
        inventory_pb2.CounterConsumption(counter_set=counters.name, counters=consumption)
    )
    return device


def _option(
    whole: inventory_pb2.Device,
    chip: NpuChip,
    template: str,
    k: int,
    *,
    counters: inventory_pb2.CounterSet,
    total: int,
) -> inventory_pb2.Device:
    """The `k`-th vNPU of `template` that a claim may get on `chip`, made at its prepare: no
    id, node or variable of its own (those come with the vNPU made for the claim)."""
    device = inventory_pb2.Device(name=model.option_name(chip, template, k), kind="npu")
    device.parent = whole.name
    for key, value in whole.attributes.items():
        if key not in ("index", "vfioViable", "iommuGroup", "pciBusID"):
            device.attributes[key].CopyFrom(value)
    device.attributes["chipName"].string = f"{chip.name}{template}"
    device.attributes["vnpuTemplate"].string = template
    device.attributes["profile"].string = template
    device.attributes[ON_DEMAND].bool = True
    consumption = model.vnpu_consumption(template, total=total)
    device.capacity["aiCore"] = consumption[model.AI_CORE_COUNTER]
    if (memory := _MEMORY.search(template)) is not None:
        device.capacity["memCapacity"] = f"{int(memory.group(1))}Gi"
    device.consumes_counters.append(
        inventory_pb2.CounterConsumption(counter_set=counters.name, counters=consumption)
    )
    return device


def _options(
    whole: inventory_pb2.Device, chip: NpuChip, *, counters: inventory_pb2.CounterSet, total: int
) -> list[inventory_pb2.Device]:
    """Per template of the chip's model, as many options as its AI cores and the ids the
    allocation agent makes vNPUs under hold; the same whatever exists, so that no claim's
    prepare or unprepare changes what is published."""
    physical = chip.phy_id if chip.phy_id is not None else chip.device_id
    room = len(model.on_demand_ids(physical, chip.name))
    options = []
    for template in model.templates(chip.name):
        cores = model.template_cores(template) or total
        for k in range(min(total // cores, room)):
            options.append(_option(whole, chip, template, k, counters=counters, total=total))
    return options


def _with_vnpus(
    whole: inventory_pb2.Device, chip: NpuChip, listing: VnpuListing
) -> tuple[list[inventory_pb2.Device], inventory_pb2.CounterSet | None]:
    """The chip's static vNPUs and options, and the counter set they share with the chip.

    vNPUs under the ids the allocation agent makes its own under (`model.on_demand_ids`) are
    the claims' and are published as the options they were allocated as, never by their id.
    """
    physical = chip.phy_id if chip.phy_id is not None else chip.device_id
    claims = model.on_demand_ids(physical, chip.name)
    static = {vnpu: t for vnpu, t in sorted(listing.vnpus.items()) if vnpu not in claims}
    offered = model.templates(chip.name)
    if not static and not offered:
        return [], None
    total = model.counter_total(chip, static.values(), total=listing.total_ai_cores)
    counters = inventory_pb2.CounterSet(
        name=model.counter_set_name(chip), counters=model.whole_chip_consumption(total)
    )
    whole.consumes_counters.append(
        inventory_pb2.CounterConsumption(
            counter_set=counters.name, counters=model.whole_chip_consumption(total)
        )
    )
    vnpus = [
        _vnpu(whole, chip, vnpu, template, counters=counters, total=total)
        for vnpu, template in static.items()
    ]
    return [*vnpus, *_options(whole, chip, counters=counters, total=total)], counters


def to_scan(
    chips: Sequence[NpuChip],
    topo: Topology,
    *,
    facts: PciFacts,
    vnpus: VnpuViews | None = None,
    vfio: Mapping[str, Viability] | None = None,
) -> Scan:
    """The devices and counter sets of one scan (pure); NpuSmiError when the outputs disagree."""
    names = model.device_names(chips)
    keys = _topology_keys(chips, topo)
    groups = {keys[topo_id]: group for topo_id, group in hccs_groups(topo).items()}
    devices: list[inventory_pb2.Device] = []
    counter_sets: list[inventory_pb2.CounterSet] = []
    for chip in chips:
        whole = _device(
            chip,
            name=names[(chip.npu_id, chip.chip_id)],
            group=groups.get(chip.device_id),
            facts=facts.get(chip.bus_id, (None, None)),
        )
        devices.append(whole)
        listing = (vnpus or {}).get((chip.npu_id, chip.chip_id))
        if listing is not None:
            partitions, counters = _with_vnpus(whole, chip, listing)
            devices += partitions
            if counters is not None:
                counter_sets.append(counters)
        # The whole chip only, after its vNPUs copied its attributes (docs/vfio.md).
        if (viability := (vfio or {}).get(chip.bus_id)) is not None:
            vfio_attributes(whole.attributes, bus_id=chip.bus_id, viability=viability)
    return Scan(devices=tuple(devices), shared_counters=tuple(counter_sets))


class AscendBackend:
    """A `DeviceBackend` over npu-smi."""

    name = "ascend"

    def __init__(
        self,
        *,
        run_command: CommandRunner,
        npu_smi: str = "npu-smi",
        sysfs: Sysfs | None = None,
        timeout_s: float = 10.0,
        poll_s: float = 10.0,
    ) -> None:
        self.changed = asyncio.Event()
        self.npu_smi = npu_smi
        self.run_command = run_command
        self.sysfs = sysfs or Sysfs()
        self.timeout_s = timeout_s
        self.poll_s = poll_s

    async def _npu_smi(self, *args: str) -> str:
        try:
            return await self.run_command([self.npu_smi, *args], timeout_s=self.timeout_s)
        except CommandFailedError as exc:
            raise BackendUnavailableError(str(exc), backend=self.name) from exc

    async def _vnpus(self, chip: NpuChip) -> VnpuListing | None:
        """The chip's vNPUs as the host sees them; None when npu-smi has no such view of it
        (virtualization unsupported there: the query fails or prints no vNPU table). A vNPU
        table that does not add up raises NpuSmiError."""
        card, index = str(chip.npu_id), str(chip.chip_id)
        argv = [self.npu_smi, "info", "-t", "info-vnpu", "-i", card, "-c", index]
        try:
            output = await self.run_command(argv, timeout_s=self.timeout_s)
        except CommandFailedError:
            return None
        return parse_vnpu_view(output)

    def _pci_facts(self, chips: Sequence[NpuChip]) -> PciFacts:
        return {
            c.bus_id: (self.sysfs.pcie_root(c.bus_id), self.sysfs.numa_node(c.bus_id))
            for c in chips
        }

    async def scan(self) -> Scan:
        info, topo = await asyncio.gather(
            self._npu_smi("info"), self._npu_smi("info", "-t", "topo")
        )
        try:
            chips = parse_info(info)
            matrix = parse_topo(topo) if chips else Topology((), {}, {})
            vnpus = {(c.npu_id, c.chip_id): await self._vnpus(c) for c in chips}
            facts = await asyncio.to_thread(self._pci_facts, chips)
            vfio = await asyncio.to_thread(
                lambda: {c.bus_id: self.sysfs.vfio(c.bus_id) for c in chips}
            )
            return to_scan(chips, matrix, facts=facts, vnpus=vnpus, vfio=vfio)
        except NpuSmiError as exc:
            raise BackendUnavailableError(
                f"npu-smi output not understood: {exc}", backend=self.name
            ) from exc

    async def watch(self) -> None:
        """Eternal: npu-smi has no hot-plug events; ask for a rescan every `poll_s`."""
        while True:
            await asyncio.sleep(self.poll_s)
            self.changed.set()
