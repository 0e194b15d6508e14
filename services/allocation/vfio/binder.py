"""Moves the PCI functions of a claim's devices to vfio-pci and back (docs/vfio.md).

`bind` (prepare), per device of the record (`PreparedVfio`):

1. Check the device's IOMMU group in sysfs (`shared.vfio.pci.check_group`): the group the
   inventory said, only functions of the device itself, no bridge, each of the backend's PCI
   vendor (`VENDORS`), none held by another claim in the ledger. Nothing is written for a claim
   any of whose devices fails.
2. Record every function not yet recorded for the claim, with its driver and
   `driver_override` as they are now, in the ledger (durably). A retry keeps what the first
   try recorded: by then the function may already be on vfio-pci.
3. Per function: `driver_override` := `vfio-pci`; `<dev>/driver/unbind` unless unbound or on
   vfio-pci; `drivers/vfio-pci/bind` unless bound; then it must be on vfio-pci.

`release` (unprepare), per recorded function: `driver_override` back to what it was (an empty
write clears it); `<dev>/driver/unbind` from vfio-pci (unless it was on vfio-pci before the
claim); `drivers/<original>/bind` (then `drivers_probe`) when it had a driver. Then the
claim's entries leave the ledger. The vfio-pci side must succeed, or the claim's unprepare
fails and the kubelet retries; a driver that will not take its function back (module
unloaded) leaves the function unbound, logged `vfio_driver_not_restored`.

`recover` (start): a completed claim's functions are bound again where they are not (a crash
between a write and the record, an administrator); a claim left PrepareStarted is the
kubelet's retry's (or its unprepare's); entries of a claim without a record are released,
unless the checkpoint directory itself was lost.

Every step is idempotent and reads sysfs before it writes, so each crash point (`CRASH_STEPS`
`vfio-*`) is finished by the retry or undone by the unprepare. Blocking calls run in a thread;
one lock keeps the ledger's read-modify-write whole.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import structlog

from services.allocation.claim.checkpoint import PreparedVfio
from services.allocation.config import AllocationConfig
from services.allocation.vfio.ledger import Binding, VfioLedger
from services.allocation.vfio.sysfs import PciSysfs, for_backend
from shared.errors import ClaimError, DeviceNotAllocatableError
from shared.vfio import pci

__all__ = ["CRASH_EXIT_CODE", "VENDORS", "VfioBinder", "build"]

log = structlog.get_logger(__name__)

VENDORS: dict[str, frozenset[str] | None] = {
    "nvml": frozenset({"0x10de"}),  # NVIDIA
    "ascend": frozenset({"0x19e5"}),  # Huawei
    "sim": None,  # a sim tree: any vendor
}
"""PCI vendor ids a backend's devices (and each function of their groups) must have."""
VFIO = pci.VFIO_DRIVER
CRASH_EXIT_CODE = 137
"""As the preparer's seam exits: the status of a process killed by SIGKILL."""


def _no_crash(step: str) -> None:
    del step


class VfioBinder:
    def __init__(
        self,
        sysfs: PciSysfs,
        ledger: VfioLedger,
        *,
        vendors: frozenset[str] | None,
        crash_point: Callable[[str], None] = _no_crash,
    ) -> None:
        """`crash_point(step)`: the preparer's fault-injection seam, called after each step."""
        self.sysfs = sysfs
        self.ledger = ledger
        self.vendors = vendors
        self._crash_point = crash_point
        self._lock = threading.Lock()

    @property
    def root(self) -> Path:
        return self.sysfs.root

    async def bind(self, claim_uid: str, devices: Sequence[PreparedVfio]) -> None:
        await asyncio.to_thread(self.bind_blocking, claim_uid, devices)

    async def release(self, claim_uid: str) -> None:
        await asyncio.to_thread(self.release_blocking, claim_uid)

    async def recover(
        self, *, completed: Collection[str], started: Collection[str], keep_orphans: bool
    ) -> None:
        await asyncio.to_thread(
            self.recover_blocking,
            completed=completed,
            started=started,
            keep_orphans=keep_orphans,
        )

    def claim_uids(self) -> set[str]:
        return {b.claim_uid for b in self.ledger.read()}

    # -- prepare

    def bind_blocking(self, claim_uid: str, devices: Sequence[PreparedVfio]) -> None:
        with self._lock:
            bindings = self._record(claim_uid, devices)
        for binding in bindings:
            self._to_vfio(binding)

    def _record(self, claim_uid: str, devices: Sequence[PreparedVfio]) -> list[Binding]:
        """Check every device's group, record the functions not yet recorded; the claim's
        bindings in order."""
        ledger = self.ledger.read(claim_uid)
        held = {b.bdf: b for b in ledger}
        wanted: list[Binding] = []
        for device in devices:
            try:
                group, functions = pci.check_group(
                    self.root, device.pci_bus_id, vendors=self.vendors
                )
            except pci.NotViableError as exc:
                raise DeviceNotAllocatableError(
                    f"prepare claim {claim_uid}: device {device.device} cannot pass through to "
                    f"a virtual machine: {exc}",
                    claim_uid=claim_uid,
                    device=device.device,
                ) from None
            if group != device.iommu_group:
                raise DeviceNotAllocatableError(
                    f"prepare claim {claim_uid}: device {device.device}: sysfs puts "
                    f"{device.pci_bus_id} in IOMMU group {group}, the inventory in "
                    f"{device.iommu_group}",
                    claim_uid=claim_uid,
                    device=device.device,
                )
            for function in functions:
                known = held.get(function.bdf)
                if known is not None and known.claim_uid != claim_uid:
                    raise DeviceNotAllocatableError(
                        f"prepare claim {claim_uid}: PCI function {function.bdf} of device "
                        f"{device.device} is bound to vfio-pci for claim {known.claim_uid}",
                        claim_uid=claim_uid,
                        device=device.device,
                    )
                wanted.append(
                    known
                    or Binding(
                        claim_uid=claim_uid,
                        device=device.device,
                        bdf=function.bdf,
                        iommu_group=group,
                        original_driver=function.driver,
                        original_override=function.driver_override,
                    )
                )
        new = [b for b in wanted if b.bdf not in held]
        if new:
            self.ledger.write([*ledger, *new], claim_uid)
            self._crash_point("vfio-recorded")
        return wanted

    def _to_vfio(self, binding: Binding) -> None:
        bdf, uid = binding.bdf, binding.claim_uid
        here = pci.device_dir(self.root, bdf)
        function = self._read(binding)
        if function.driver_override != VFIO:
            self._write(here / "driver_override", VFIO, uid)
            self._crash_point("vfio-override-set")
            function = self._read(binding)
        if function.driver not in (None, VFIO):
            self._write(here / "driver" / "unbind", bdf, uid)
            self._crash_point("vfio-unbound")
            function = self._read(binding)
        if function.driver is None:
            self._write(self._driver_dir(VFIO) / "bind", bdf, uid, missing=_NO_VFIO_PCI)
            function = self._read(binding)
        if function.driver != VFIO:
            raise ClaimError(
                f"claim {uid}: PCI function {bdf} is bound to {function.driver or 'no driver'} "
                "after binding it to vfio-pci",
                claim_uid=uid,
            )

    # -- unprepare

    def release_blocking(self, claim_uid: str) -> None:
        with self._lock:
            bindings = [b for b in self.ledger.read(claim_uid) if b.claim_uid == claim_uid]
        if not bindings:
            return
        for binding in bindings:
            self._restore(binding)
        with self._lock:
            kept = [b for b in self.ledger.read(claim_uid) if b.claim_uid != claim_uid]
            self.ledger.write(kept, claim_uid)
        log.info("vfio_released", functions=[b.bdf for b in bindings])

    def _restore(self, binding: Binding) -> None:
        bdf, uid = binding.bdf, binding.claim_uid
        here = pci.device_dir(self.root, bdf)
        function = pci.read_function(self.root, bdf)
        if function is None:
            log.warning("vfio_function_gone", bdf=bdf, device=binding.device)
            return
        if function.driver_override != binding.original_override:
            self._write(here / "driver_override", binding.original_override or "\n", uid)
            self._crash_point("unprepare-vfio-override-restored")
            function = self._read(binding)
        original = binding.original_driver
        if function.driver == VFIO and original != VFIO:
            self._write(here / "driver" / "unbind", bdf, uid)
            self._crash_point("unprepare-vfio-unbound")
            function = self._read(binding)
        if function.driver is not None or original is None:
            return
        try:
            self.sysfs.write(self._driver_dir(original) / "bind", bdf)
        except OSError as exc:
            log.warning("vfio_driver_bind_failed", bdf=bdf, driver=original, error=str(exc))
            try:
                self.sysfs.write(self.root / "bus" / "pci" / "drivers_probe", bdf)
            except OSError as probe:
                log.warning("vfio_drivers_probe_failed", bdf=bdf, error=str(probe))
        restored = pci.read_function(self.root, bdf)
        if restored is None or restored.driver != original:
            log.error(
                "vfio_driver_not_restored",
                bdf=bdf,
                device=binding.device,
                driver=original,
                now=restored.driver if restored is not None else None,
            )

    # -- start

    def recover_blocking(
        self, *, completed: Collection[str], started: Collection[str], keep_orphans: bool
    ) -> None:
        try:
            bindings = self.ledger.read()
        except ClaimError as exc:
            log.error("vfio_ledger_unreadable", error=str(exc))
            return
        for uid in sorted({b.claim_uid for b in bindings}):
            try:
                if uid in completed:
                    for binding in (b for b in bindings if b.claim_uid == uid):
                        if self._read(binding).driver != VFIO:
                            self._to_vfio(binding)
                            log.warning("vfio_rebound", claim_uid=uid, bdf=binding.bdf)
                elif uid in started:
                    continue
                elif keep_orphans:
                    log.warning("vfio_kept_without_record", claim_uid=uid)
                else:
                    self.release_blocking(uid)
                    log.warning("vfio_orphan_released", claim_uid=uid)
            except ClaimError as exc:
                log.error("vfio_not_recovered", claim_uid=uid, error=str(exc))

    # -- sysfs

    def _driver_dir(self, driver: str) -> Path:
        return self.root / "bus" / "pci" / "drivers" / driver

    def _read(self, binding: Binding) -> pci.PciFunction:
        function = pci.read_function(self.root, binding.bdf)
        if function is None:
            raise ClaimError(
                f"claim {binding.claim_uid}: PCI function {binding.bdf} of device "
                f"{binding.device} is gone from sysfs",
                claim_uid=binding.claim_uid,
            )
        return function

    def _write(self, path: Path, value: str, claim_uid: str, *, missing: str = "") -> None:
        try:
            self.sysfs.write(path, value)
        except FileNotFoundError as exc:
            raise ClaimError(
                f"claim {claim_uid}: {missing or f'writing {path}: {exc.strerror}'}",
                claim_uid=claim_uid,
            ) from exc
        except OSError as exc:
            raise ClaimError(
                f"claim {claim_uid}: writing {value.strip()!r} to {path}: {exc.strerror or exc}",
                claim_uid=claim_uid,
            ) from exc


_NO_VFIO_PCI = "the vfio-pci driver is not loaded on this node (modprobe vfio-pci)"


def build(config: AllocationConfig) -> VfioBinder | None:
    """The agent's binder over `--sysfs-root`, with the preparer's fault-injection seam; None
    where the backend cannot pass devices through (`sysfs.for_backend`)."""
    sysfs = for_backend(config.backend, config.sysfs_root)
    if sysfs is None:
        return None
    crash_at = config.crash_at

    def crash_point(step: str) -> None:
        if crash_at == step:
            log.warning("crash_injected", step=step)
            os._exit(CRASH_EXIT_CODE)

    return VfioBinder(
        sysfs,
        VfioLedger(config.vfio_ledger_path),
        vendors=VENDORS.get(config.backend),
        crash_point=crash_point,
    )
