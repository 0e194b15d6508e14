"""Concurrent NodePrepareResources: 200 claims at once against the real local stack.

The agents, the API emulator and nats-server run as separate processes (LocalStack); this
process plays one kubelet connection. 150 distinct single-device claims plus 50 repeats of
UIDs already in the burst are sent as 200 concurrent calls; each call's latency and the whole
burst's wall time are measured. Afterwards the allocation agent's resident memory is read from
/proc/<pid>/status (VmRSS), and its /metrics tell how many checkpoint changes the burst made
durable with how many directory fsyncs (group commit shares them between concurrent claims).

`python -m bench.concurrency` runs this section alone and merges its figures into
bench/results.json; `--runs N` repeats it on fresh stacks and keeps each figure's median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.cdi_dir import node_like_cdi_dir
from bench.prepare import allocated_claims, timed_prepare
from bench.stats import percentile
from devcluster import flow
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import LocalStack, StackConfig
from shared.bus.session import open_bus
from shared.config import LogSettings
from shared.logging import configure as configure_logging

__all__ = ["ConcurrencyFigures", "main", "measure_concurrency", "rss_mb"]

NAMESPACE = "bench-concurrent"
CALLS = 200
REPEATS = 50


@dataclass(frozen=True, slots=True)
class ConcurrencyFigures:
    call_ms: list[float]
    wall_s: float
    rss_mb: float
    checkpoint_changes: int = 0
    """Checkpoint files written or removed durably during the burst."""
    checkpoint_dir_fsyncs: int = 0
    """Directory fsyncs that made them durable."""

    def as_results(self) -> dict[str, float]:
        return {
            "prepare_concurrent_claims_per_s": round(len(self.call_ms) / self.wall_s, 1),
            "prepare_concurrent_p99_ms": round(percentile(self.call_ms, 99), 3),
            "prepare_concurrent_p50_ms": round(percentile(self.call_ms, 50), 3),
            "prepare_concurrent_calls": len(self.call_ms),
            "prepare_concurrent_checkpoint_changes": self.checkpoint_changes,
            "prepare_concurrent_checkpoint_dir_fsyncs": self.checkpoint_dir_fsyncs,
            "allocation_rss_mb": round(self.rss_mb, 1),
        }


def rss_mb(pid: int) -> float:
    """Resident set size of process `pid` in MiB, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def measure_concurrency(*, workdir: Path) -> ConcurrencyFigures:
    with node_like_cdi_dir() as cdi_dir:
        config = StackConfig(
            workdir=workdir / "stack", node_name="bench-node", log_level="warning", cdi_dir=cdi_dir
        )
        return await _measure(config)


async def _measure(config: StackConfig) -> ConcurrencyFigures:
    async with LocalStack(config) as stack:
        async with open_bus(stack.nats_settings) as bus, stack.kube() as kube:
            inventory = await flow.wait_inventory(
                bus, driver=config.driver_name, node=config.node_name
            )
            devices = [d.name for d in inventory.devices]
            claims = await allocated_claims(
                kube,
                config=config,
                devices=devices,
                count=CALLS - REPEATS,
                namespace=NAMESPACE,
            )
        kubelet = KubeletEmulator(config.registry_dir)
        metrics_url = stack.ops_url("allocation")
        try:
            await kubelet.register(driver=config.driver_name)
            calls = claims + claims[:REPEATS]
            before = await _group_commit_counts(metrics_url)
            start = time.perf_counter()
            call_ms = await asyncio.gather(*(timed_prepare(kubelet, claim) for claim in calls))
            wall_s = time.perf_counter() - start
            after = await _group_commit_counts(metrics_url)
            await kubelet.unprepare(claims)
        finally:
            await kubelet.close()
        pid = stack.agents["allocation"].pid
        assert pid is not None
        memory = rss_mb(pid)
    return ConcurrencyFigures(
        call_ms=list(call_ms),
        wall_s=wall_s,
        rss_mb=memory,
        checkpoint_changes=after[0] - before[0],
        checkpoint_dir_fsyncs=after[1] - before[1],
    )


async def _group_commit_counts(url: str) -> tuple[int, int]:
    """(durable changes, directory fsyncs) of the allocation agent's checkpoint store."""
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        response.raise_for_status()
        text = await response.text()
    found = {"dra_group_commit_changes_total": 0.0, "dra_group_commit_directory_fsyncs_total": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in found and sample.labels.get("store") == "checkpoint":
                found[sample.name] = sample.value
    return (
        int(found["dra_group_commit_changes_total"]),
        int(found["dra_group_commit_directory_fsyncs_total"]),
    )


async def _median_of_runs(runs: int) -> dict[str, float]:
    measured = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="dra-bench-") as tmp:
            measured.append((await measure_concurrency(workdir=Path(tmp))).as_results())
    return {key: statistics.median(r[key] for r in measured) for key in measured[0]}


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.concurrency")
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    parser.add_argument("--runs", type=int, default=1, help="fresh stacks; medians reported")
    args = parser.parse_args()
    configure_logging(LogSettings(level="warning", format="console"), service="bench")
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update(asyncio.run(_median_of_runs(args.runs)))
    results["bench_machine"] = f"{platform.machine()} {platform.python_version()}"
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(results, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
