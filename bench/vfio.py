"""`vfio_prepare_p99_ms`, `vfio_unprepare_p99_ms`: preparing a claim for a virtual machine
(docs/vfio.md) and undoing it, over the fake sysfs (`shared.vfio.kernel_sim`).

The allocation agent's own `ClaimPreparer` runs in this process with its real checkpoint,
CDI writer, metadata files and VFIO binder (ledger included), all on disk as on a node (the CDI
specs on tmpfs where there is one); the claim comes from memory (no API server, no gRPC), so a
sample is what VFIO adds to the agent's side of a prepare: plan, durable PrepareStarted, the
ledger's fsynced write, the sysfs reads and writes that move the GPU and its audio function to
vfio-pci, metadata and CDI spec, PrepareCompleted. An unprepare undoes it all: spec, metadata,
the functions back to `nvidia` and `snd_hda_intel`, the ledger and the record. The fake kernel
answers in microseconds; a real kernel's unbind and bind (the drivers' probe and remove) take
what they take on the node, not counted here. Run alone: `python -m bench.vfio`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import results_file
from bench.cdi_dir import node_like_cdi_dir
from bench.stats import percentile
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore
from services.allocation.claim.claims import AllocatedClaim, ClaimRef, DeviceResult, OpaqueConfig
from services.allocation.dra.preparer import ClaimPreparer
from services.allocation.metadata.files import MetadataFiles
from services.allocation.vfio.binder import VfioBinder
from services.allocation.vfio.ledger import VfioLedger
from shared.config import LogSettings
from shared.logging import configure as configure_logging
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vfio import pci
from shared.vfio.kernel_sim import SimPciKernel, add_function

__all__ = ["measure_vfio"]

_DRIVER, _NODE = "sim.dra-suite.io", "bench-node"
_GPUS = 8
_VFIO = {"apiVersion": f"{_DRIVER}/v1alpha1", "kind": "DeviceConfig", "passthrough": "vfio"}
ROUNDS = 5


def _bdf(index: int) -> str:
    return f"0000:{0x18 + 0x10 * index:02x}:00.0"


def _tree(root: Path) -> inventory_pb2.Inventory:
    """An HGX-like node: 8 GPUs, each alone with its audio function in its IOMMU group."""
    inventory = inventory_pb2.Inventory(driver=_DRIVER, node=_NODE, pool=_NODE, backend="sim")
    for index in range(_GPUS):
        bdf, group = _bdf(index), 20 + index
        pcie_root = f"pci0000:{0x10 + 0x10 * index:02x}"
        add_function(root, bdf, iommu_group=group, pcie_root=pcie_root)
        add_function(
            root,
            bdf[:-1] + "1",
            device="0x22a3",
            pci_class=0x040300,
            driver="snd_hda_intel",
            iommu_group=group,
            pcie_root=pcie_root,
        )
        device = inventory.devices.add(name=f"gpu-{index}", kind="gpu")
        device.device_nodes.add(path=f"/dev/nvidia{index}", host_path="/dev/null")
        device.attributes["type"].string = "gpu"
        device.attributes["resource.kubernetes.io/pciBusID"].string = bdf
        device.attributes["iommuGroup"].int = group
        device.attributes["vfioViable"].bool = True
    return inventory


class _Claims:
    def __init__(self) -> None:
        self.claims: dict[str, AllocatedClaim] = {}

    async def read(self, ref: ClaimRef, *, deadline: float | None = None) -> AllocatedClaim:
        return self.claims[ref.uid]


class _Inventory:
    def __init__(self, current: inventory_pb2.Inventory) -> None:
        self.current = current


def _claim(index: int) -> AllocatedClaim:
    uid = str(uuid.uuid4())
    return AllocatedClaim(
        ref=ClaimRef(namespace="vms", name=f"vm-{uid[:8]}", uid=uid),
        results=(DeviceResult(request="gpu", pool=_NODE, device=f"gpu-{index % _GPUS}"),),
        configs=(OpaqueConfig(source="FromClaim", requests=(), parameters=_VFIO),),
    )


def _expect(root: Path, index: int, driver: str) -> None:
    found = pci.read_function(root, _bdf(index % _GPUS))
    if found is None or found.driver != driver:
        raise RuntimeError(f"gpu-{index % _GPUS} is on {found and found.driver}, not {driver}")


async def _round(
    preparer: ClaimPreparer, claims: _Claims, root: Path, count: int
) -> tuple[list[float], list[float]]:
    """`count` claims, one GPU at a time: prepare, check it is on vfio-pci, unprepare."""
    prepare_ms: list[float] = []
    unprepare_ms: list[float] = []
    for index in range(count):
        claim = _claim(index)
        claims.claims[claim.ref.uid] = claim
        start = time.perf_counter()
        await preparer.prepare(claim.ref)
        prepare_ms.append((time.perf_counter() - start) * 1000)
        _expect(root, index, pci.VFIO_DRIVER)
        start = time.perf_counter()
        await preparer.unprepare(claim.ref)
        unprepare_ms.append((time.perf_counter() - start) * 1000)
        _expect(root, index, "nvidia")
        del claims.claims[claim.ref.uid]
    return prepare_ms, unprepare_ms


async def measure_vfio(
    *, workdir: Path, iterations: int = 200, warmup: int = 20, rounds: int = ROUNDS
) -> dict[str, Any]:
    root = workdir / "sys"
    data = workdir / "plugin"
    inventory = _tree(root)
    claims = _Claims()
    with node_like_cdi_dir() as cdi_dir:
        (data / "checkpoint").mkdir(parents=True, mode=0o700)
        checkpoints = CheckpointStore(data / "checkpoint")
        checkpoints.load()
        cdi = CDIWriter(cdi_dir or workdir / "cdi", driver=_DRIVER)
        cdi.prepare_root()
        preparer = ClaimPreparer(
            claims=claims,
            inventory=_Inventory(inventory),
            checkpoints=checkpoints,
            cdi_writer=cdi,
            driver=_DRIVER,
            backend="sim",
            metadata_files=MetadataFiles(data / "dra-device-metadata"),
            vfio=VfioBinder(
                SimPciKernel(root), VfioLedger(data / "vfio-bindings.json"), vendors=None
            ),
        )
        await _round(preparer, claims, root, warmup)
        measured = [await _round(preparer, claims, root, iterations) for _ in range(rounds)]
    prepare = [ms for round_ms, _ in measured for ms in round_ms]
    unprepare = [ms for _, round_ms in measured for ms in round_ms]
    return {
        "vfio_prepare_p50_ms": round(percentile(prepare, 50), 3),
        "vfio_prepare_p99_ms": round(statistics.median(percentile(p, 99) for p, _ in measured), 3),
        "vfio_unprepare_p50_ms": round(percentile(unprepare, 50), 3),
        "vfio_unprepare_p99_ms": round(
            statistics.median(percentile(u, 99) for _, u in measured), 3
        ),
        "vfio_samples": len(prepare),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.vfio")
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()
    configure_logging(LogSettings(level="warning", format="console"), service="bench")
    with tempfile.TemporaryDirectory(prefix="dra-bench-vfio-") as tmp:
        figures = asyncio.run(measure_vfio(workdir=Path(tmp), iterations=args.iterations))
    results_file.merge(args.out, figures)
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
