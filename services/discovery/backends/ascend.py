"""The Ascend backend: Huawei NPUs from `npu-smi info` and `npu-smi info -t topo`.

Each chip becomes a device named `npu-<id>` with the attributes of the sim profile, so the
same DeviceClasses and CEL work on both: `type` ("npu"), `chipName`, `index`, `physicalId`,
`cardId` and `chipId` (the NPU ID and Chip ID columns: the card, and the chip on it, so that
a claim can ask for chips of one card), `numaNode` (sysfs), `topologyGroup` (HCCS domain
from the topo matrix),
`resource.kubernetes.io/pcieRoot` (sysfs), capacity `memCapacity` and `aiCore`. Device nodes
are `/dev/davinci<id>` and the shared control nodes; the container gets
`ASCEND_VISIBLE_DEVICES=<id>` (docs/hardware.md §3.5). Output that does not parse fails the scan
with BackendUnavailableError, and the scanner keeps the last good inventory.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from services.discovery.backends import Scan
from services.discovery.backends.npusmi import (
    NpuChip,
    NpuSmiFormatError,
    Topology,
    hccs_groups,
    parse_info,
    parse_topo,
)
from services.discovery.backends.sysfs import Sysfs
from shared import quantity
from shared.commands import CommandFailedError, CommandRunner
from shared.errors import BackendUnavailableError
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["AI_CORES", "CONTROL_NODES", "AscendBackend", "PciFacts", "ai_cores", "to_devices"]

AI_CORES = {
    "910A": 30,
    "910B1": 24,
    "910B2": 24,
    "910B3": 20,
    "910B4": 20,
    "910B4-1": 20,
    "Ascend910": 20,
    "310P3": 8,
}
"""AI cores per chip (docs/hardware.md §3.1); A3 (`Ascend910`) per die."""
CONTROL_NODES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
_VNPU = re.compile(r"vir(\d+)")

PciFacts = dict[str, tuple[str | None, int | None]]
"""Bus id -> (PCIe root, NUMA node), from sysfs."""


def ai_cores(chip_name: str) -> int | None:
    """AI cores of a chip by name; a vNPU (`310Pvir01`, `910B4vir05_1c_8g`) has its template's."""
    template = _VNPU.search(chip_name)
    if template is not None:
        return int(template.group(1))
    return AI_CORES.get(chip_name.removeprefix("Ascend ").strip())


def _topology_keys(chips: Sequence[NpuChip], topo: Topology) -> dict[int, int]:
    """Topo id -> device id: topo labels are device ids, or card ids with one chip per card."""
    by_device = {chip.device_id: chip.device_id for chip in chips}
    if set(topo.ids) == set(by_device):
        return by_device
    by_card = {chip.npu_id: chip.device_id for chip in chips}
    if len(by_card) == len(chips) and set(topo.ids) == set(by_card):
        return by_card
    raise NpuSmiFormatError(
        f"npu-smi topo lists chips {sorted(topo.ids)}, npu-smi info {sorted(by_device)}"
    )


def _device(
    chip: NpuChip, *, group: str | None, facts: tuple[str | None, int | None]
) -> inventory_pb2.Device:
    device_id = chip.device_id
    device = inventory_pb2.Device(
        name=f"npu-{device_id}",
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


def to_devices(
    chips: Sequence[NpuChip], topo: Topology, *, facts: PciFacts
) -> tuple[inventory_pb2.Device, ...]:
    """The devices of one scan (pure); NpuSmiFormatError when the outputs disagree."""
    seen: set[int] = set()
    for chip in chips:
        if chip.device_id in seen:
            raise NpuSmiFormatError(f"npu-smi info: two chips with device id {chip.device_id}")
        seen.add(chip.device_id)
    keys = _topology_keys(chips, topo)
    groups = {keys[topo_id]: group for topo_id, group in hccs_groups(topo).items()}
    return tuple(
        _device(
            chip,
            group=groups.get(chip.device_id),
            facts=facts.get(chip.bus_id, (None, None)),
        )
        for chip in chips
    )


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
            facts = await asyncio.to_thread(self._pci_facts, chips)
            return Scan(devices=to_devices(chips, matrix, facts=facts))
        except NpuSmiFormatError as exc:
            raise BackendUnavailableError(
                f"npu-smi output not understood: {exc}", backend=self.name
            ) from exc

    async def watch(self) -> None:
        """Eternal: npu-smi has no hot-plug events; ask for a rescan every `poll_s`."""
        while True:
            await asyncio.sleep(self.poll_s)
            self.changed.set()
