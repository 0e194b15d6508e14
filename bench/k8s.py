"""The real control plane's figures: how long each minor took to build cold, how big the cache
is, how long the cached binaries take to a healthy control plane, and how long a pod bound by
kube-scheduler takes to be prepared (bench/k8s_prepare.py).

`make bench` includes these when the newest minor is built; `python -m bench.k8s` measures
only them and merges them into bench/results.json. Build times are those the cache recorded
when it was built (a build is not repeated to measure it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.k8s_prepare import measure_real_prepare
from devcluster.controlplane import (
    NEWEST,
    RELEASES,
    ControlPlaneNotBuiltError,
    RealControlPlane,
    cached_binaries,
    release,
)
from devcluster.controlplane.build import cache_root

__all__ = ["measure_k8s"]


async def measure_k8s(*, starts: int = 3) -> dict[str, Any]:
    """The figures, or {} when the newest minor is not built on this machine."""
    figures: dict[str, Any] = {}
    for minor, target in RELEASES.items():
        try:
            binaries = cached_binaries(target)
        except ControlPlaneNotBuiltError:
            continue
        took = binaries.build_seconds()
        figures[f"k8s_build_s_{minor.replace('.', '_')}"] = took["kubernetes"]
        figures["k8s_build_etcd_s"] = took["etcd"]
    if not figures:
        return {}
    figures["k8s_cache_mb"] = round(_size(cache_root()) / 2**20)
    try:
        newest = cached_binaries(release(NEWEST))
    except ControlPlaneNotBuiltError:
        return figures
    seconds = []
    for _ in range(starts):
        with tempfile.TemporaryDirectory(prefix="dra-bench-k8s-") as workdir:
            async with RealControlPlane(newest, Path(workdir)) as plane:
                seconds.append(plane.started_in_s)
    figures["k8s_start_s"] = round(statistics.median(seconds), 2)
    figures["k8s_start_max_s"] = round(max(seconds), 2)
    figures["k8s_start_version"] = newest.release.version
    with tempfile.TemporaryDirectory(prefix="dra-k8s-", dir="/tmp") as workdir:
        figures.update(await measure_real_prepare(Path(workdir)))
    return figures


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.k8s")
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    args = parser.parse_args()
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    figures = asyncio.run(measure_k8s())
    results.update(figures)
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
