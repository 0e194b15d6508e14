"""The ascend monitor: polls `npu-smi` for each NPU chip's health and error codes.

Every `poll_s`: `npu-smi info` lists the chips and their Health; a chip that is not `OK`
gets `npu-smi info -t health -i <card> -c <chip>` for its error codes, which `npu_faults`
turns into a fault (or none). Health `UNKNOWN` makes the chip unknown. A run that fails,
exceeds `timeout_s` or prints something unparsable raises `BackendUnavailableError`: the
watchdog then reports the devices unmonitored and restarts the monitor.

Device names are discovery's (`shared.vendors.ascend.devices.device_name`: `npu-<device id>`,
the `Device` column on 310/310P, `Phy-ID` on A3, else the NPU id), so a fault names exactly the
device the ResourceSlice publishes; static vNPUs get their chip's faults through the inventory
(`attribution`, by `parent`). `npu-smi info` is read by the one parser every agent uses
(`shared.vendors.ascend.npusmi`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog

from shared import commands
from shared.errors import BackendUnavailableError
from shared.vendors.ascend import devices, npu_faults, npusmi
from shared.vendors.ascend.npusmi import NpuChip
from shared.vendors.parts.health import ObservationSink
from shared.vendors.parts.observation import Observation, Observations

__all__ = ["AscendMonitor", "Runner", "device_names", "run_command"]

log = structlog.get_logger(__name__)

Runner = Callable[[Sequence[str], float], Awaitable[str]]
"""Runs a command with a deadline and returns its stdout; raises BackendUnavailableError."""


async def run_command(argv: Sequence[str], timeout_s: float) -> str:
    """`argv`'s stdout; a missing binary, non-zero exit or timeout raises."""
    try:
        return await commands.run_command(argv, timeout_s=timeout_s)
    except commands.CommandFailedError as exc:
        raise BackendUnavailableError(str(exc), backend="ascend") from exc


def device_names(chips: Sequence[NpuChip]) -> dict[tuple[int, int], str]:
    """The device name of each (card, chip): the one discovery publishes it under."""
    return devices.device_names(chips)


def _unreadable(exc: npusmi.NpuSmiError) -> BackendUnavailableError:
    return BackendUnavailableError(f"npu-smi output not understood: {exc}", backend="ascend")


class AscendMonitor:
    """`DeviceMonitor` over `npu-smi`, polled."""

    def __init__(
        self,
        *,
        pool: str,
        npu_smi: str = "npu-smi",
        timeout_s: float = 10.0,
        poll_s: float = 5.0,
        isolate_unknown: bool = True,
        runner: Runner = run_command,
    ) -> None:
        self._pool = pool
        self._npu_smi = npu_smi
        self._timeout_s = timeout_s
        self._poll_s = poll_s
        self._isolate_unknown = isolate_unknown
        self._runner = runner

    async def run(self, sink: ObservationSink) -> None:
        while True:
            sink(await self.poll())
            await asyncio.sleep(self._poll_s)

    async def poll(self) -> Observations:
        """One complete view, from one `npu-smi info` and a health query per unwell chip."""
        summary = await self._runner([self._npu_smi, "info"], self._timeout_s)
        try:
            chips = npusmi.parse_info(summary)
            names = device_names(chips)
        except npusmi.NpuSmiError as exc:
            raise _unreadable(exc) from exc
        seen = [await self._observe(chip, names[(chip.npu_id, chip.chip_id)]) for chip in chips]
        return Observations(pool=self._pool, devices=tuple(seen))

    async def _observe(self, chip: NpuChip, name: str) -> Observation:
        if chip.health == "OK":
            return Observation(device=name)
        if chip.health == "UNKNOWN":
            return Observation(device=name, unknown=True)
        card, index = str(chip.npu_id), str(chip.chip_id)
        argv = [self._npu_smi, "info", "-t", "health", "-i", card, "-c", index]
        output = await self._runner(argv, self._timeout_s)
        try:
            health = npusmi.parse_chip_health(output)
        except npusmi.NpuSmiError as exc:
            raise _unreadable(exc) from exc
        fault = npu_faults.fault_for(
            health.codes,
            status=health.status,
            information=health.information,
            isolate_unknown=self._isolate_unknown,
        )
        if fault is not None:
            log.debug("npu_fault_seen", device=name, code=fault.code, cause=fault.cause)
        return Observation(device=name, fault=fault)
