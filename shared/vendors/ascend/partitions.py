"""The ascend backend's partition manager: static vNPUs made with npu-smi at prepare time.

A partition of an NPU is a vNPU of a template (`vir05_1c_8g`, …) made with `npu-smi set -t
create-vnpu` on the chip's card and chip ids (from `npu-smi info -m`), under an id this manager
picks: the lowest one of the upper half of the chip's ids (`devices.on_demand_ids`:
`[phy*16+108, phy*16+115]`, `[phy*16+104, phy*16+107]` on 310P) the chip does not list and
no entry holds (docs/hardware.md §3.6). Discovery publishes no vNPU under those ids as a
device of its own: a vNPU template option (`createdOnDemand`) stands for it while a claim holds
it, so no slice names a vNPU that unprepare destroyed. A vNPU of the template already listed
under those ids that no entry names (an administrator's) is handed over as it is, recorded
`adopted`, and kept at unprepare. npu-smi's output is read by the one Ascend parser every agent uses
(`shared.vendors.ascend.npusmi`, which raises `NpuSmiError`); its test double is
`tests/fakes/npusmi_vnpu.py`. The container gets `/dev/vdavinci<id>` (host) as
`/dev/davinci<id>` with
`ASCEND_VISIBLE_DEVICES=<id>` and `ASCEND_RUNTIME_OPTIONS=VIRTUAL` (docs/hardware.md §3.5); the
control nodes stay the device's.

Crash safety: an entry naming (claim, device) -> (card, chip, vNPU id, template) is written to
`vnpu-partitions.json` *before* npu-smi is asked, and marked made after npu-smi lists it. A
retry finds the entry and completes it (a vNPU of that id and template already listed is the
one a killed process made), so there is never a second one. Only vNPUs an entry names are
destroyed, and only while they still have the entry's template: an admin's vNPUs are left
alone. A failed create whose vNPU the chip does not list drops the entry.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from pathlib import Path

import structlog

from shared import commands
from shared.commands import CommandFailedError, CommandRunner
from shared.errors import ClaimError, InvalidOpaqueConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.ascend import devices, npusmi
from shared.vendors.ascend.npusmi import ChipLocation, NpuSmiError, VnpuListing
from shared.vendors.parts.ledger import MALFORMED, Entry, StateFile, to_partition
from shared.vendors.parts.partitions import Partition, invalid_profile

__all__ = ["KIND", "VnpuPartitionManager"]

log = structlog.get_logger(__name__)

KIND = "VnpuPartitions"
_VNPU_CHIP = re.compile(r"vir\d+")


def _int_attribute(device: inventory_pb2.Device, *names: str) -> int | None:
    for name in names:
        if name in device.attributes:
            return device.attributes[name].int
    return None


def _template_cores(template: str) -> int:
    return devices.template_cores(template) or 0


class VnpuPartitionManager:
    """A `PartitionManager` for the ascend backend over npu-smi and `vnpu-partitions.json`."""

    def __init__(
        self,
        path: Path,
        *,
        run_command: CommandRunner = commands.run_command,
        npu_smi: str = "npu-smi",
        timeout_s: float = 30.0,
    ) -> None:
        self.state = StateFile(path, kind=KIND)
        self.npu_smi = npu_smi
        self.timeout_s = timeout_s
        self._run = run_command
        self._lock = asyncio.Lock()

    def supports(self, backend: str) -> bool:
        return backend == "ascend"

    def check(
        self,
        *,
        claim_uid: str,
        device: inventory_pb2.Device,
        profile: str,
        placement: int | None = None,
    ) -> None:
        def invalid(reason: str) -> InvalidOpaqueConfigError:
            return invalid_profile(claim_uid, reason)

        if device.kind != "npu":
            raise invalid(
                f"vNPU templates need an NPU; {device.name} is a {device.kind or 'device'}"
            )
        if devices.template_cores(profile) is None:
            raise invalid(f"{profile!r} is not a vNPU template name (like vir05_1c_8g)")
        if placement is not None:
            raise invalid(f"vNPUs have no placements; {device.name} was asked for {placement}")
        chip = device.attributes["chipName"].string if "chipName" in device.attributes else ""
        if _VNPU_CHIP.search(chip):
            raise invalid(f"device {device.name} is a vNPU ({chip}) already")
        cores = device.capacity.get("aiCore", "")
        if cores.isdigit() and _template_cores(profile) > int(cores):
            raise invalid(f"{profile} needs more AI cores than {device.name} has ({cores})")

    async def create(
        self,
        *,
        claim_uid: str,
        device: inventory_pb2.Device,
        profile: str,
        placement: int | None = None,
    ) -> Partition:
        if placement is not None:
            raise ClaimError(
                f"claim {claim_uid}: vNPUs have no placements; {device.name} was asked for "
                f"{placement}",
                claim_uid=claim_uid,
            )
        async with self._lock:
            entries = await asyncio.to_thread(self.state.read, claim_uid)
            entry = next(
                (e for e in entries if (e["claimUID"], e["device"]) == (claim_uid, device.name)),
                None,
            )
            if entry is not None and entry.get("profile") != profile:
                raise ClaimError(
                    f"claim {claim_uid}: device {device.name} already has a "
                    f"{entry.get('profile')} partition, not {profile}",
                    claim_uid=claim_uid,
                )
            try:
                listing = None
                if entry is None:
                    entry, listing = await self._plan(claim_uid, device, profile, entries)
                    entries.append(entry)
                    await asyncio.to_thread(self.state.write, entries, claim_uid)
                await self._make(entry, entries, claim_uid, listing)
            except MALFORMED as exc:
                raise self.state.malformed(claim_uid, exc) from exc
            log.info("partition_created", device=device.name, profile=profile, id=entry["id"])
            return to_partition(entry)

    async def delete_claim(self, claim_uid: str) -> list[Partition]:
        async with self._lock:
            entries = await asyncio.to_thread(self.state.read, claim_uid)
            mine = [e for e in entries if e["claimUID"] == claim_uid]
            removed: list[Entry] = []
            errors: list[ClaimError] = []
            for entry in mine:
                try:
                    await self._destroy(entry, claim_uid)
                    removed.append(entry)
                except ClaimError as exc:
                    errors.append(exc)
                except MALFORMED as exc:
                    errors.append(self.state.malformed(claim_uid, exc))
            if removed:
                kept = [e for e in entries if all(e is not r for r in removed)]
                await asyncio.to_thread(self.state.write, kept, claim_uid)
                log.info("partitions_deleted", ids=[e.get("vnpuId") for e in removed])
            if errors:
                raise errors[0]
            return [to_partition(e) for e in removed]

    async def partitions(self) -> list[Partition]:
        async with self._lock:
            return [to_partition(e) for e in await asyncio.to_thread(self.state.read, "")]

    async def _npu_smi(self, claim_uid: str, *args: str) -> str:
        try:
            return await self._run([self.npu_smi, *args], timeout_s=self.timeout_s)
        except CommandFailedError as exc:
            raise ClaimError(f"claim {claim_uid}: {exc}", claim_uid=claim_uid) from exc

    async def _locate(self, claim_uid: str, device: inventory_pb2.Device) -> ChipLocation:
        """The card and chip ids of `device`: its device id is the chip's logic id (or, on A3,
        its physical id), as discovery names devices; else a card with this id and one chip."""
        output = await self._npu_smi(claim_uid, "info", "-m")
        try:
            chips = npusmi.parse_chip_map(output)
        except NpuSmiError as exc:
            raise ClaimError(f"claim {claim_uid}: {exc}", claim_uid=claim_uid) from exc
        index = _int_attribute(device, "index")
        if index is None:
            raise ClaimError(
                f"claim {claim_uid}: device {device.name} has no index attribute",
                claim_uid=claim_uid,
            )
        for matches in (
            [c for c in chips if c.logic_id == index],
            [c for c in chips if c.phy_id == index],
            [c for c in chips if c.card == index],
        ):
            if len(matches) == 1:
                return matches[0]
        raise ClaimError(
            f"claim {claim_uid}: device {device.name} (id {index}) is not one chip of "
            "`npu-smi info -m`",
            claim_uid=claim_uid,
        )

    async def _list(self, claim_uid: str, card: int, chip: int) -> VnpuListing:
        args = ("info", "-t", "info-vnpu", "-i", str(card), "-c", str(chip))
        output = await self._npu_smi(claim_uid, *args)
        try:
            return npusmi.parse_vnpus(output)
        except NpuSmiError as exc:
            raise ClaimError(f"claim {claim_uid}: {exc}", claim_uid=claim_uid) from exc

    async def _plan(
        self, claim_uid: str, device: inventory_pb2.Device, profile: str, entries: Sequence[Entry]
    ) -> tuple[Entry, VnpuListing]:
        """The entry of a new vNPU (its chip, a free id, room for the template) and the chip's
        vNPUs as they were."""
        location = await self._locate(claim_uid, device)
        listing = await self._list(claim_uid, location.card, location.chip)
        cores = _template_cores(profile)
        if listing.free_ai_cores is not None and cores > listing.free_ai_cores:
            raise ClaimError(
                f"claim {claim_uid}: no room for a {profile} vNPU on {device.name} "
                f"({listing.free_ai_cores} AI cores free, {cores} needed)",
                claim_uid=claim_uid,
            )
        physical = _int_attribute(device, "physicalId", "index") or 0
        chip = device.attributes["chipName"].string if "chipName" in device.attributes else ""
        ids = devices.on_demand_ids(physical, chip)
        entered = {int(e["vnpuId"]) for e in entries if "vnpuId" in e}
        entry: Entry = {
            "claimUID": claim_uid,
            "device": device.name,
            "profile": profile,
            "card": location.card,
            "chip": location.chip,
            "createdUnixMs": int(time.time() * 1000),
        }
        for vnpu in ids:
            if listing.vnpus.get(vnpu) == profile and vnpu not in entered:
                log.info("vnpu_handed_over", device=device.name, vnpu=vnpu)
                entry.update(vnpuId=vnpu, adopted=True)
                return entry, listing
        held = set(listing.vnpus) | entered
        free = [i for i in ids if i not in held]
        if not free:
            raise ClaimError(
                f"claim {claim_uid}: no free vNPU id on {device.name} "
                f"({len(listing.vnpus)} vNPUs on it)",
                claim_uid=claim_uid,
            )
        entry["vnpuId"] = free[0]
        return entry, listing

    async def _make(
        self, entry: Entry, entries: list[Entry], claim_uid: str, listing: VnpuListing | None
    ) -> None:
        """Create the entry's vNPU unless the chip lists it already; record it as made.
        `listing`: the chip's vNPUs, when they were just read."""
        card, chip, vnpu = int(entry["card"]), int(entry["chip"]), int(entry["vnpuId"])
        device, template = entry["device"], str(entry["profile"])
        listed = (listing or await self._list(claim_uid, card, chip)).vnpus
        if vnpu in listed and listed[vnpu] != template:
            raise ClaimError(
                f"claim {claim_uid}: vNPU {vnpu} on {device} is a {listed[vnpu]}, not the "
                f"{template} this claim recorded; left alone",
                claim_uid=claim_uid,
            )
        if vnpu not in listed:
            await self._create_vnpu(entry, entries, claim_uid)
        elif not entry.get("made") and not entry.get("adopted"):
            log.warning("vnpu_adopted", device=device, vnpu=vnpu)
        entry.update(
            made=True,
            id=str(vnpu),
            env={"ASCEND_VISIBLE_DEVICES": str(vnpu), "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"},
            deviceNodes=[(f"/dev/davinci{vnpu}", f"/dev/vdavinci{vnpu}")],
        )
        await asyncio.to_thread(self.state.write, entries, claim_uid)

    async def _create_vnpu(self, entry: Entry, entries: list[Entry], claim_uid: str) -> None:
        card, chip, vnpu = str(entry["card"]), str(entry["chip"]), int(entry["vnpuId"])
        device, template = entry["device"], str(entry["profile"])
        args = ("set", "-t", "create-vnpu", "-i", card, "-c", chip, "-f", template)
        failure: CommandFailedError | NpuSmiError | None = None
        try:
            output = await self._run(
                [self.npu_smi, *args, "-v", str(vnpu)], timeout_s=self.timeout_s
            )
            npusmi.check_status(output, f"npu-smi create-vnpu {template} on {device}")
        except (CommandFailedError, NpuSmiError) as exc:
            failure = exc
        listed = (await self._list(claim_uid, int(card), int(chip))).vnpus
        if listed.get(vnpu) == template:
            return  # made, whatever npu-smi printed
        if not entry.get("made"):
            # Nothing of ours exists: drop the entry, or its id stays held.
            entries.remove(entry)
            await asyncio.to_thread(self.state.write, entries, claim_uid)
        reason = str(failure) if failure is not None else "npu-smi said OK but does not list it"
        raise ClaimError(
            f"claim {claim_uid}: could not create a {template} vNPU on {device}: {reason}",
            claim_uid=claim_uid,
        )

    async def _destroy(self, entry: Entry, claim_uid: str) -> None:
        """Destroy the entry's vNPU if the chip still lists it with the entry's template."""
        if "vnpuId" not in entry or entry.get("adopted"):
            return  # nothing made, or handed over as it was: it stays
        card, chip, vnpu = int(entry["card"]), int(entry["chip"]), int(entry["vnpuId"])
        listed = (await self._list(claim_uid, card, chip)).vnpus
        if listed.get(vnpu) != entry.get("profile"):
            if vnpu in listed:
                log.warning("vnpu_not_ours_kept", device=entry["device"], vnpu=vnpu)
            return
        args = ("set", "-t", "destroy-vnpu", "-i", str(card), "-c", str(chip), "-v", str(vnpu))
        output = await self._npu_smi(claim_uid, *args)
        try:
            npusmi.check_status(output, f"npu-smi destroy-vnpu {vnpu} on {entry['device']}")
        except NpuSmiError as exc:
            raise ClaimError(f"claim {claim_uid}: {exc}", claim_uid=claim_uid) from exc
