"""One NodePrepareResources call naming 10,000 claims: what it costs the allocation agent's memory.

The local stack runs as processes; this process plays one kubelet and sends a single call with
10,000 claims that do not exist (each one a GET and a "not found" answer, as in the attack that
once took the agent from 164 MB to over 1 GB). The agent's resident memory is read from
/proc/<pid>/status before the call and after it, with the agent idle again;
`prepare_huge_call_rss_growth_mb` is the difference. Only the claims in flight (at most
`batch.MAX_IN_FLIGHT`) should cost memory while the call runs, and little should stay.

`python -m bench.huge_call` runs this section alone and merges its figures into
bench/results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.cdi_dir import node_like_cdi_dir
from bench.concurrency import rss_mb
from devcluster import flow
from devcluster.kubelet import KubeletClaim, KubeletEmulator
from devcluster.stack import LocalStack, StackConfig
from shared.bus.session import open_bus
from shared.config import LogSettings
from shared.logging import configure as configure_logging

__all__ = ["HugeCallFigures", "main", "measure_huge_call"]

CLAIMS = 10_000
SETTLE_S = 2.0
"""Idle time before each RSS reading, so that the figure is what stays, not what is in flight."""


@dataclass(frozen=True, slots=True)
class HugeCallFigures:
    rss_before_mb: float
    rss_after_mb: float
    call_s: float
    failed_claims: int

    def as_results(self) -> dict[str, float]:
        return {
            "prepare_huge_call_claims": CLAIMS,
            "prepare_huge_call_s": round(self.call_s, 2),
            "prepare_huge_call_rss_before_mb": round(self.rss_before_mb, 1),
            "prepare_huge_call_rss_after_mb": round(self.rss_after_mb, 1),
            "prepare_huge_call_rss_growth_mb": round(self.rss_after_mb - self.rss_before_mb, 1),
        }


async def measure_huge_call(*, workdir: Path) -> HugeCallFigures:
    with node_like_cdi_dir() as cdi_dir:
        config = StackConfig(
            workdir=workdir / "stack", node_name="bench-node", log_level="warning", cdi_dir=cdi_dir
        )
        async with LocalStack(config) as stack:
            async with open_bus(stack.nats_settings) as bus:
                await flow.wait_inventory(bus, driver=config.driver_name, node=config.node_name)
            pid = stack.agents["allocation"].pid
            assert pid is not None
            kubelet = KubeletEmulator(config.registry_dir)
            try:
                await kubelet.register(driver=config.driver_name)
                await asyncio.sleep(SETTLE_S)
                before = rss_mb(pid)
                claims = [
                    KubeletClaim(namespace="bench-huge", name=f"claim-{i}", uid=str(uuid.uuid4()))
                    for i in range(CLAIMS)
                ]
                started = time.perf_counter()
                answer = await kubelet.prepare(claims)
                call_s = time.perf_counter() - started
                await asyncio.sleep(SETTLE_S)
                after = rss_mb(pid)
            finally:
                await kubelet.close()
    failed = sum(1 for claim in answer.claims.values() if claim.error)
    return HugeCallFigures(
        rss_before_mb=before, rss_after_mb=after, call_s=call_s, failed_claims=failed
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.huge_call")
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    args = parser.parse_args()
    configure_logging(LogSettings(level="warning", format="console"), service="bench")
    with tempfile.TemporaryDirectory(prefix="dra-bench-") as tmp:
        figures = asyncio.run(measure_huge_call(workdir=Path(tmp)))
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update(figures.as_results())
    results["bench_machine"] = f"{platform.machine()} {platform.python_version()}"
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures.as_results(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
