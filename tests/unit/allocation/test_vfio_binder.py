"""The VFIO binder over the fake kernel: a claim's device and its group's functions go to
vfio-pci and back to their own drivers, each step recorded before it is written, so that a
crash at any step is finished by the retry or undone by the unprepare; groups that hold
anything but the device are refused before anything is written. `KernelSysfs` writes exactly
what it is given to the file, as `echo` does on a real node."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import structlog

from services.allocation.claim.checkpoint import PreparedVfio
from services.allocation.vfio import sysfs as vfio_sysfs
from services.allocation.vfio.binder import VENDORS, VfioBinder
from services.allocation.vfio.ledger import Binding, VfioLedger
from shared.errors import ClaimError, DeviceNotAllocatableError
from shared.vfio import pci
from tests.fakes import sysfs_pci

UID = "3f2b0c8e-0000-4000-8000-000000000001"
OTHER = "3f2b0c8e-0000-4000-8000-000000000002"
BDF = "0000:3b:00.0"
AUDIO = "0000:3b:00.1"
GPU = PreparedVfio(device="gpu-0", pci_bus_id=BDF, iommu_group=12)


class Crash(Exception):
    """Stands for the process dying at a crash point."""


def _binder(
    root: Path, ledger: Path, *, crash_at: str = "", vendors: frozenset[str] | None = None
) -> tuple[VfioBinder, sysfs_pci.SimPciKernel]:
    kernel = sysfs_pci.SimPciKernel(root)

    def crash_point(step: str) -> None:
        if step == crash_at:
            raise Crash(step)

    binder = VfioBinder(
        kernel,
        VfioLedger(ledger),
        vendors=VENDORS["nvml"] if vendors is None else vendors,
        crash_point=crash_point,
    )
    return binder, kernel


def _state(root: Path, *bdfs: str) -> list[tuple[str | None, str | None]]:
    """(driver, driver_override) of each function."""
    found = [pci.read_function(root, bdf) for bdf in bdfs]
    return [(f.driver, f.driver_override) for f in found if f is not None]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    sysfs_pci.gpu(root)
    return root


def test_bind_moves_the_group_to_vfio_pci_and_release_brings_the_drivers_back(tree, tmp_path):
    binder, kernel = _binder(tree, tmp_path / "vfio.json")
    binder.bind_blocking(UID, [GPU])
    assert _state(tree, BDF, AUDIO) == [("vfio-pci", "vfio-pci"), ("vfio-pci", "vfio-pci")]
    dev, drivers = f"bus/pci/devices/{BDF}", "bus/pci/drivers"
    audio = f"bus/pci/devices/{AUDIO}"
    assert kernel.writes == [
        (f"{dev}/driver_override", "vfio-pci"),
        (f"{dev}/driver/unbind", BDF),
        (f"{drivers}/vfio-pci/bind", BDF),
        (f"{audio}/driver_override", "vfio-pci"),
        (f"{audio}/driver/unbind", AUDIO),
        (f"{drivers}/vfio-pci/bind", AUDIO),
    ]
    assert VfioLedger(tmp_path / "vfio.json").read() == [
        Binding(
            claim_uid=UID,
            device="gpu-0",
            bdf=BDF,
            iommu_group=12,
            original_driver="nvidia",
            original_override=None,
        ),
        Binding(
            claim_uid=UID,
            device="gpu-0",
            bdf=AUDIO,
            iommu_group=12,
            original_driver="snd_hda_intel",
            original_override=None,
        ),
    ]
    kernel.writes.clear()
    binder.bind_blocking(UID, [GPU])  # a repeated prepare writes nothing
    assert kernel.writes == []
    binder.release_blocking(UID)
    assert _state(tree, BDF, AUDIO) == [("nvidia", None), ("snd_hda_intel", None)]
    assert kernel.writes[:3] == [
        (f"{dev}/driver_override", "\n"),
        (f"{dev}/driver/unbind", BDF),
        (f"{drivers}/nvidia/bind", BDF),
    ]
    assert not (tmp_path / "vfio.json").exists()
    binder.release_blocking(UID)  # an unknown claim releases cleanly


def _add(root: Path, **function: object) -> None:
    sysfs_pci.add_function(root, iommu_group=12, pcie_root="pci0000:3a", **function)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda root: _add(root, bdf="0000:3c:00.0", driver="nvidia"), "another PCI device"),
        (lambda root: _add(root, bdf="0000:3b:00.2", pci_class=0x060400), "bridge"),
        (lambda root: _add(root, bdf="0000:3b:00.2", vendor="0x8086"), "vendor 0x8086"),
        (
            lambda root: (pci.device_dir(root, BDF) / "iommu_group").unlink(),
            "no IOMMU group",
        ),
    ],
    ids=["other-device", "bridge", "other-vendor", "no-iommu"],
)
def test_a_group_that_may_not_pass_through_is_refused_before_any_write(
    tree, tmp_path, change, match
):
    change(tree)
    binder, kernel = _binder(tree, tmp_path / "vfio.json")
    with pytest.raises(DeviceNotAllocatableError, match=match):
        binder.bind_blocking(UID, [GPU])
    assert kernel.writes == []
    assert not (tmp_path / "vfio.json").exists()
    assert _state(tree, BDF) == [("nvidia", None)]


def test_the_inventory_s_group_must_be_the_one_sysfs_shows(tree, tmp_path):
    binder, kernel = _binder(tree, tmp_path / "vfio.json")
    forged = PreparedVfio(device="gpu-0", pci_bus_id=BDF, iommu_group=13)
    with pytest.raises(DeviceNotAllocatableError, match="IOMMU group 12, the inventory in 13"):
        binder.bind_blocking(UID, [forged])
    assert kernel.writes == []


def test_a_host_function_named_by_a_forged_inventory_is_never_unbound(tree, tmp_path):
    """An Intel NIC alone in its group is viable, but not of the nvml backend's vendor."""
    sysfs_pci.add_function(
        tree, "0000:5e:00.0", vendor="0x8086", pci_class=0x020000, driver="ice", iommu_group=30
    )
    binder, kernel = _binder(tree, tmp_path / "vfio.json")
    nic = PreparedVfio(device="gpu-0", pci_bus_id="0000:5e:00.0", iommu_group=30)
    with pytest.raises(DeviceNotAllocatableError, match="vendor 0x8086, not 0x10de"):
        binder.bind_blocking(UID, [nic])
    assert kernel.writes == []


def test_a_function_another_claim_holds_is_refused(tree, tmp_path):
    VfioLedger(tmp_path / "vfio.json").write(
        [
            Binding(
                claim_uid=OTHER,
                device="gpu-0",
                bdf=AUDIO,
                iommu_group=12,
                original_driver="snd_hda_intel",
                original_override=None,
            )
        ]
    )
    binder, kernel = _binder(tree, tmp_path / "vfio.json")
    with pytest.raises(DeviceNotAllocatableError, match=f"for claim {OTHER}"):
        binder.bind_blocking(UID, [GPU])
    assert kernel.writes == []


def test_without_the_vfio_pci_module_the_claim_says_so(tree, tmp_path):
    shutil.rmtree(tree / "bus" / "pci" / "drivers" / "vfio-pci")
    binder, _ = _binder(tree, tmp_path / "vfio.json")
    with pytest.raises(ClaimError, match=r"vfio-pci driver is not loaded .*modprobe vfio-pci"):
        binder.bind_blocking(UID, [GPU])
    # What was done is recorded: the unprepare puts it back.
    binder.release_blocking(UID)
    assert _state(tree, BDF, AUDIO) == [("nvidia", None), ("snd_hda_intel", None)]


def test_a_function_an_administrator_bound_to_vfio_pci_stays_there(tmp_path):
    root = tmp_path / "sys"
    sysfs_pci.gpu(root, audio=False, driver=None)
    kernel = sysfs_pci.SimPciKernel(root)
    kernel.write(pci.device_dir(root, BDF) / "driver_override", "vfio-pci")
    kernel.write(root / "bus" / "pci" / "drivers_probe", BDF)
    binder, kernel = _binder(root, tmp_path / "vfio.json")
    binder.bind_blocking(UID, [GPU])
    assert kernel.writes == []
    binder.release_blocking(UID)
    assert _state(root, BDF) == [("vfio-pci", "vfio-pci")]


PREPARE_CRASHES = ["vfio-recorded", "vfio-override-set", "vfio-unbound"]


@pytest.mark.parametrize("step", PREPARE_CRASHES)
@pytest.mark.parametrize("then", ["retry", "unprepare"])
def test_a_crash_at_each_bind_step_is_finished_or_undone(tree, tmp_path, step, then):
    binder, _ = _binder(tree, tmp_path / "vfio.json", crash_at=step)
    with pytest.raises(Crash):
        binder.bind_blocking(UID, [GPU])
    # The ledger was written before the first sysfs write: the originals are known.
    originals = {b.bdf: b.original_driver for b in VfioLedger(tmp_path / "vfio.json").read()}
    assert originals == {BDF: "nvidia", AUDIO: "snd_hda_intel"}
    restarted, _ = _binder(tree, tmp_path / "vfio.json")
    if then == "retry":
        restarted.bind_blocking(UID, [GPU])
        assert _state(tree, BDF, AUDIO) == [("vfio-pci", "vfio-pci")] * 2
    restarted.release_blocking(UID)
    assert _state(tree, BDF, AUDIO) == [("nvidia", None), ("snd_hda_intel", None)]
    assert not (tmp_path / "vfio.json").exists()


@pytest.mark.parametrize("step", ["unprepare-vfio-override-restored", "unprepare-vfio-unbound"])
def test_a_crash_at_each_release_step_is_finished_by_the_retry(tree, tmp_path, step):
    _binder(tree, tmp_path / "vfio.json")[0].bind_blocking(UID, [GPU])
    binder, _ = _binder(tree, tmp_path / "vfio.json", crash_at=step)
    with pytest.raises(Crash):
        binder.release_blocking(UID)
    restarted, _ = _binder(tree, tmp_path / "vfio.json")
    restarted.release_blocking(UID)
    assert _state(tree, BDF, AUDIO) == [("nvidia", None), ("snd_hda_intel", None)]
    assert not (tmp_path / "vfio.json").exists()


def test_recovery_rebinds_completed_claims_and_releases_orphans(tmp_path):
    root = tmp_path / "sys"
    one = sysfs_pci.gpu(root, "0000:3b:00.0", group=12, audio=False)
    two = sysfs_pci.gpu(root, "0000:86:00.0", group=50, audio=False, pcie_root="pci0000:85")
    three = sysfs_pci.gpu(root, "0000:af:00.0", group=60, audio=False, pcie_root="pci0000:ae")
    binder, kernel = _binder(root, tmp_path / "vfio.json")
    uids = {"completed": UID, "orphan": OTHER, "started": "3f2b0c8e-0000-4000-8000-000000000003"}
    for uid, tree in zip(uids.values(), (one, two, three), strict=True):
        binder.bind_blocking(
            uid, [PreparedVfio(device="d", pci_bus_id=tree.bdf, iommu_group=tree.group)]
        )
    # Someone put the completed claim's GPU back on nvidia behind our back.
    kernel.write(pci.device_dir(root, one.bdf) / "driver" / "unbind", one.bdf)
    kernel.write(pci.device_dir(root, one.bdf) / "driver_override", "\n")
    kernel.write(root / "bus" / "pci" / "drivers_probe", one.bdf)
    binder.recover_blocking(
        completed={uids["completed"]}, started={uids["started"]}, keep_orphans=False
    )
    assert _state(root, one.bdf, two.bdf, three.bdf) == [
        ("vfio-pci", "vfio-pci"),
        ("nvidia", None),
        ("vfio-pci", "vfio-pci"),
    ]
    assert binder.claim_uids() == {uids["completed"], uids["started"]}


def test_recovery_keeps_orphans_when_the_checkpoint_directory_was_lost(tree, tmp_path):
    binder, _ = _binder(tree, tmp_path / "vfio.json")
    binder.bind_blocking(UID, [GPU])
    binder.recover_blocking(completed=set(), started=set(), keep_orphans=True)
    assert _state(tree, BDF) == [("vfio-pci", "vfio-pci")]
    assert binder.claim_uids() == {UID}


def test_a_driver_that_will_not_take_its_function_back_leaves_it_unbound(tree, tmp_path):
    binder, _ = _binder(tree, tmp_path / "vfio.json")
    binder.bind_blocking(UID, [GPU])
    shutil.rmtree(tree / "bus" / "pci" / "drivers" / "snd_hda_intel")  # module unloaded
    with structlog.testing.capture_logs() as logs:
        binder.release_blocking(UID)
    assert _state(tree, BDF, AUDIO) == [("nvidia", None), (None, None)]
    assert [e["bdf"] for e in logs if e["event"] == "vfio_driver_not_restored"] == [AUDIO]
    assert not (tmp_path / "vfio.json").exists()


def test_an_unreadable_ledger_fails_the_claim_and_is_left_alone(tree, tmp_path):
    ledger = tmp_path / "vfio.json"
    ledger.write_text(json.dumps({"kind": "VfioBindings", "bindings": [{"bdf": "../x"}]}))
    binder, kernel = _binder(tree, ledger)
    with pytest.raises(ClaimError, match="malformed"):
        binder.bind_blocking(UID, [GPU])
    ledger.write_text(
        json.dumps(
            {
                "kind": "VfioBindings",
                "bindings": [
                    {"claimUID": UID, "device": "d", "bdf": BDF, "iommuGroup": 12}
                    | {"originalDriver": "../../x"}
                ],
            }
        )
    )
    with pytest.raises(ClaimError, match="driver name"):
        binder.release_blocking(UID)
    assert kernel.writes == []
    assert "../../x" in ledger.read_text()


def test_kernel_sysfs_writes_the_value_to_the_existing_file_and_creates_none(tmp_path):
    target = tmp_path / "driver_override"
    target.write_text("")
    writer = vfio_sysfs.KernelSysfs(tmp_path)
    writer.write(target, "vfio-pci")
    assert target.read_text() == "vfio-pci"
    with pytest.raises(FileNotFoundError):
        writer.write(tmp_path / "drivers" / "vfio-pci" / "bind", BDF)
    assert not (tmp_path / "drivers").exists()


def test_the_sim_backend_passes_through_only_over_a_sim_tree(tmp_path):
    assert vfio_sysfs.for_backend("sim", Path("/sys")) is None
    assert isinstance(vfio_sysfs.for_backend("sim", tmp_path), sysfs_pci.SimPciKernel)
    assert isinstance(vfio_sysfs.for_backend("nvml", Path("/sys")), vfio_sysfs.KernelSysfs)
    assert isinstance(vfio_sysfs.for_backend("ascend", Path("/sys")), vfio_sysfs.KernelSysfs)
    assert vfio_sysfs.for_backend("other", tmp_path) is None
