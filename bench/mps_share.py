"""NodePrepareResources latency of a claim that shares a GPU, with its own MPS control daemon.

In process: the allocation agent's ClaimPreparer (sim backend, real checkpoint and CDI writes on
disk) against the fake `nvidia-cuda-mps-control` (tests/fakes), so each sample includes
starting one daemon (`-d`), sending its limits and the durable PrepareStarted the daemon needs.
The same claims prepared without MPS are the floor. The fake is a Python program: a real
control daemon starts faster, so the figure is an upper bound of what MPS adds.

`python -m bench.mps_share` runs only this measure and merges its figures into
bench/results.json.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import results_file
from bench.stats import percentile
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore
from services.allocation.claim.claims import ClaimReader, ClaimRef
from services.allocation.dra.preparer import ClaimPreparer
from services.allocation.mps.daemons import MpsDaemons
from shared.kube.resources import ResourceType
from shared.pb.drasuite.v1 import inventory_pb2
from tests.fakes import mps_control

__all__ = ["measure_mps_share"]

DRIVER = "sim.dra-suite.io"
NODE = "bench-node"
GPU = "GPU-9d11c4e2-e840-51ed-b15f-0be7ae073686"


class _Claims:
    """The API server's claims, in memory (the prepare's GET is not what is measured here)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    async def get(
        self, rt: ResourceType, name: str, *, namespace: str | None = None
    ) -> dict[str, Any]:
        return self.objects[name]


class _Inventory:
    current = inventory_pb2.Inventory(
        driver=DRIVER,
        node=NODE,
        pool=NODE,
        backend="sim",
        generation=1,
        devices=[
            inventory_pb2.Device(
                name="gpu-0",
                kind="gpu",
                uuid=GPU,
                capacity={"memory": "80Gi"},
                shared_capacity={"memory": "80Gi"},
                device_nodes=[inventory_pb2.DeviceNode(path="/dev/nvidia0", host_path="/dev/null")],
                env={"NVIDIA_VISIBLE_DEVICES": "0"},
            )
        ],
    )


def _shared_claim(claims: _Claims, name: str) -> ClaimRef:
    uid = str(uuid.uuid4())
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": NODE,
        "device": "gpu-0",
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"memory": "8Gi"},
    }
    claims.objects[name] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "bench", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": {"devices": {"results": [result], "config": []}}},
    }
    return ClaimRef(namespace="bench", name=name, uid=uid)


async def _round(base: Path, *, mps: bool, claims: int) -> list[float]:
    """Prepare `claims` fresh shared claims one by one (ms each), then unprepare them all."""
    kube = _Claims()
    checkpoints = CheckpointStore(base / "checkpoint")
    checkpoints.load()
    (base / "cdi").mkdir(parents=True, exist_ok=True)
    binary = mps_control.install(base / "bin")
    preparer = ClaimPreparer(
        claims=ClaimReader(kube, driver=DRIVER, pool=NODE),
        inventory=_Inventory(),
        checkpoints=checkpoints,
        cdi_writer=CDIWriter(base / "cdi", driver=DRIVER),
        driver=DRIVER,
        backend="sim",
        mps=MpsDaemons(base / "mps", binary=str(binary)) if mps else None,
    )
    refs = [_shared_claim(kube, f"c{i}") for i in range(claims)]
    samples = []
    try:
        for ref in refs:
            start = time.perf_counter()
            await preparer.prepare(ref)
            samples.append((time.perf_counter() - start) * 1000)
        for ref in refs:
            await preparer.unprepare(ref)
    finally:
        mps_control.kill_all(base)
    return samples


async def measure_mps_share(
    *, workdir: Path, rounds: int = 3, claims: int = 40
) -> dict[str, float]:
    """p99 by median of `rounds` rounds, as bench.prepare reports its p99."""
    with_mps, without = [], []
    for n in range(rounds):
        without.append(await _round(workdir / f"plain-{n}", mps=False, claims=claims))
        with_mps.append(await _round(workdir / f"mps-{n}", mps=True, claims=claims))
    p99 = statistics.median(percentile(r, 99) for r in with_mps)
    floor = statistics.median(percentile(r, 99) for r in without)
    pooled = [ms for r in with_mps for ms in r]
    return {
        "mps_share_prepare_p50_ms": round(percentile(pooled, 50), 3),
        "mps_share_prepare_p99_ms": round(p99, 3),
        "mps_share_prepare_floor_p99_ms": round(floor, 3),
        "mps_share_prepare_samples": len(pooled),
    }


def main() -> None:
    out = Path("bench/results.json")
    # Short: the daemons' unix sockets must fit in 107 bytes.
    with tempfile.TemporaryDirectory(prefix="dra-", dir="/tmp") as tmp:
        figures = asyncio.run(measure_mps_share(workdir=Path(tmp)))
    results_file.merge(out, figures)
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
