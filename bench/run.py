"""`make bench`: run every benchmark and merge the figures into bench/results.json.

The file is one flat JSON object of named figures, the unit in each name; keys from other
benchmarks already in the file are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
from pathlib import Path
from typing import Any

from bench.agent_rss import measure_agent_rss
from bench.bus_restore import measure_bus_restore
from bench.concurrency import measure_concurrency
from bench.device_plugin import measure_device_plugin
from bench.explain import measure_explain
from bench.health import measure_health
from bench.huge_call import measure_huge_call
from bench.image_size import measure_image_size
from bench.k8s import measure_k8s
from bench.mps_share import measure_mps_share
from bench.nats_auth import measure_nats_auth
from bench.prepare import measure_prepare
from bench.sign_verify import measure_sign_verify
from bench.slices import measure_slices
from bench.soak import measure_soak
from bench.vfio import measure_vfio
from shared.config import LogSettings
from shared.logging import configure as configure_logging

__all__ = ["main"]


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dra-bench-") as tmp:
        agent_rss = await measure_agent_rss(workdir=Path(tmp) / "agent-rss")
        figures = await measure_prepare(workdir=Path(tmp) / "prepare", iterations=args.iterations)
        concurrent = await measure_concurrency(workdir=Path(tmp) / "concurrency")
        huge_call = await measure_huge_call(workdir=Path(tmp) / "huge-call")
        health = await measure_health(workdir=Path(tmp) / "health")
        slice_figures = await measure_slices(
            workdir=Path(tmp) / "slices", steady_s=args.steady_s, changes=args.changes
        )
        soak = await measure_soak(workdir=Path(tmp) / "soak")
        device_plugin = await measure_device_plugin(workdir=Path(tmp) / "device-plugin")
        nats_auth = await measure_nats_auth(workdir=Path(tmp) / "nats-auth")
        mps_share = await measure_mps_share(workdir=Path(tmp) / "mps")
        vfio = await measure_vfio(workdir=Path(tmp) / "vfio")
        explain = await measure_explain()
        sign_verify = measure_sign_verify()
        bus_restore = await measure_bus_restore(workdir=Path(tmp) / "bus-restore")
        image = await asyncio.to_thread(measure_image_size)
        k8s = await measure_k8s()
    return {
        **agent_rss,
        **figures.as_results(),
        **concurrent.as_results(),
        **huge_call.as_results(),
        **health.as_results(),
        **slice_figures,
        **soak,
        **device_plugin.as_results(),
        **nats_auth.as_results(),
        **mps_share,
        **vfio,
        **explain,
        **sign_verify,
        **bus_restore,
        **image,
        **k8s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument(
        "--steady-s", type=float, default=60.0, help="idle window for slice_steady_writes_60s"
    )
    parser.add_argument("--changes", type=int, default=50, help="hot-plugs timed for slices")
    args = parser.parse_args()
    configure_logging(LogSettings(level="warning", format="console"), service="bench")
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update(asyncio.run(_run(args)))
    results["bench_machine"] = f"{platform.machine()} {platform.python_version()}"
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(results, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
