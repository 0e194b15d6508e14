"""The 60-second soak's figures: 50 claims/s of prepare/unprepare churn with periodic faults
against the whole node as processes (tests/reliability/soak.py, the same run as the CI test).

`soak_rss_growth_mb` is the largest growth of an agent's RSS after the warm-up (median of the
last window minus median of the window right after the warm-up), `soak_rss_growth_mb_<agent>`
each agent's; `soak_fd_delta_<agent>` and `soak_task_delta_<agent>` compare open fds and
asyncio tasks at rest after the churn with those at rest before it; `soak_task_growth_<agent>`
is the change of the task floor under load; `soak_claims_per_s` the rate achieved.

`python -m bench.soak` runs this section alone and merges it into bench/results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from shared.config import LogSettings
from shared.logging import configure as configure_logging
from tests.reliability.harness import open_reliability_node
from tests.reliability.soak import CI_PLAN, SoakPlan, run_soak

__all__ = ["measure_soak"]


async def measure_soak(*, workdir: Path, plan: SoakPlan = CI_PLAN) -> dict[str, float]:
    async with open_reliability_node(workdir) as node:
        report = await run_soak(node, plan)
    print(report.summary())
    return report.as_results()


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.soak")
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    args = parser.parse_args()
    configure_logging(LogSettings(level="warning", format="console"), service="bench")
    # Unix socket paths must stay short (<= 107 bytes): a temporary directory under /tmp.
    with tempfile.TemporaryDirectory(prefix="dra-soak-", dir="/tmp") as tmp:
        figures = asyncio.run(measure_soak(workdir=Path(tmp)))
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update(figures)
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
