"""Each agent's resident memory on a node at rest: the local stack (agents as processes, sim
profile `mixed`), discovery's and health's /readyz and allocation's /healthz answering 200
(no kubelet registers it here), then a few seconds of rest.

Figures: `discovery_rss_mb`, `health_rss_mb` and `allocation_idle_rss_mb` (the allocation
agent before any prepare; `allocation_rss_mb`, bench.concurrency, is after 200 of them). The
goal is at most 120 MB each. Run alone with `python -m bench.agent_rss`.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.scale_fleet import rss_mb
from devcluster.stack import AGENTS, LocalStack, StackConfig

__all__ = ["measure_agent_rss"]

_REST_S = 5.0
_NAMES = {
    "discovery": "discovery_rss_mb",
    "health": "health_rss_mb",
    "allocation": "allocation_idle_rss_mb",
}


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


async def measure_agent_rss(*, workdir: Path) -> dict[str, float]:
    async with LocalStack(StackConfig(workdir=workdir)) as stack:
        deadline = time.monotonic() + 60
        for agent in AGENTS:
            # The allocation agent is ready once a kubelet registered it; alive is enough here.
            url = stack.ops_url(agent, "/healthz" if agent == "allocation" else "/readyz")
            while not await asyncio.to_thread(_ready, url):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{agent} not ready within 60 s")
                await asyncio.sleep(0.5)
        await asyncio.sleep(_REST_S)
        pids = stack.agent_pids()
        return {_NAMES[agent]: round(rss_mb(pid), 1) for agent, pid in pids.items() if pid}


def main() -> None:
    out = Path("bench/results.json")
    with tempfile.TemporaryDirectory(prefix="dra-rss-") as tmp:
        figures = asyncio.run(measure_agent_rss(workdir=Path(tmp)))
    results = json.loads(out.read_text()) if out.exists() else {}
    results.update(figures)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
