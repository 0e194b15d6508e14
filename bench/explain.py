"""`dractl explain` over a whole fleet: 5,000 sim nodes of 8 NPUs (the ascend-910b profile,
built once with the discovery agent's slice code and stamped per node), a claim that fits
nowhere because another claim holds one NPU of every node, explained on every node (device
verdicts, the closest node, the one change) and rendered as JSON.

Figures: `explain_all_nodes_5000_s`, the median wall time of 3 runs from the slices to the JSON
text, and `explain_all_nodes_5000_cpu_s`, their median CPU time (what a shared machine's load
does not inflate).
Run alone with `python -m bench.explain` (merges its figure into bench/results.json).
"""

from __future__ import annotations

import asyncio
import copy
import io
import json
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from services.allocator.allocator import Cluster
from services.allocator.explanation import explain
from services.allocator.request import read_claim
from services.discovery import inventory, slices
from services.dractl import explain_view
from shared.vendors.sim.discovery import SimBackend

__all__ = ["measure_explain"]

DRIVER = "sim.dra-suite.io"
NODES = 5000
CLASSES = Path(__file__).resolve().parents[1] / "deploy/kustomize/overlays/sim/deviceclasses.yaml"
Obj = dict[str, Any]
CLAIM: Obj = {
    "metadata": {"name": "four-on-a-ring", "namespace": "default", "uid": "bench"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "npus",
                    "exactly": {
                        "deviceClassName": "npu.sim.dra-suite.io",
                        "count": 4,
                        "selectors": [
                            {"cel": {"expression": f'device.attributes["{DRIVER}"].numaNode == 1'}}
                        ],
                    },
                }
            ],
            "constraints": [{"matchAttribute": f"{DRIVER}/topologyGroup"}],
        }
    },
}


async def _fleet() -> tuple[list[Obj], list[Obj]]:
    """Every node's slices, and a claim per node holding that node's npu-5."""
    scan = await SimBackend.from_profile("ascend-910b").scan()
    identity = inventory.Identity(driver=DRIVER, node="template", pool="template", backend="sim")
    pool = slices.desired(inventory.build(scan, identity=identity, scanned_unix_ms=0))
    fleet, holders = [], []
    for n in range(NODES):
        node = f"node-{n:04d}"
        for i, content in enumerate(pool.contents):
            spec = {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": len(pool.contents)},
                **copy.deepcopy(content),
            }
            fleet.append({"metadata": {"name": f"{i:05x}-{DRIVER}-{node}"}, "spec": spec})
        result = {"request": "r", "driver": DRIVER, "pool": node, "device": "npu-5"}
        status = {"allocation": {"devices": {"results": [result]}}}
        holders.append(
            {"metadata": {"name": f"holder-{n}", "namespace": "default"}, "status": status}
        )
    return fleet, holders


def _explain_once(
    fleet: list[Obj], holders: list[Obj], classes: list[Obj]
) -> tuple[float, float, Obj]:
    start, cpu = time.perf_counter(), time.process_time()
    cluster = Cluster.build(slices=fleet, classes=classes, claims=holders, without=CLAIM)
    explanation = explain(
        cluster, read_claim(CLAIM, cluster.classes), nodes=cluster.inventory.nodes
    )
    text = io.StringIO()
    json.dump(explain_view.as_data(explanation), text)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return (
        elapsed,
        cpu,
        {
            "fits": explanation.fits,
            "closest": explanation.closest,
            "change": explanation.change,
        },
    )


async def measure_explain() -> dict[str, Any]:
    fleet, holders = await _fleet()
    classes = [
        d for d in yaml.safe_load_all(CLASSES.read_text()) if d and d["kind"] == "DeviceClass"
    ]
    runs, cpus = [], []
    for _ in range(3):
        elapsed, cpu, answer = _explain_once(fleet, holders, classes)
        runs.append(elapsed)
        cpus.append(cpu)
    # The case measured is the full one: verdicts on every node, the closest, the change.
    assert not answer["fits"], answer
    assert answer["change"], answer
    return {
        "explain_all_nodes_5000_s": round(statistics.median(runs), 3),
        "explain_all_nodes_5000_cpu_s": round(statistics.median(cpus), 3),
    }


def main() -> None:
    out = Path("bench/results.json")
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    figures = asyncio.run(measure_explain())
    results.update(figures)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
