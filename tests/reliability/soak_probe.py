"""What the soak watches in each agent process: resident memory (VmRSS in /proc/<pid>/status),
open file descriptors (/proc/<pid>/fd) and unfinished asyncio tasks (the `dra_asyncio_tasks`
gauge on the agent's /metrics, read over HTTP from its ops port).

One HTTP session serves every scrape, so its kept-alive connection to an agent is the same
descriptor (and the same server task) in every sample: scraping adds a constant, not noise.
The /metrics scrape comes before the /proc reads for that reason.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from devcluster.stack import LocalStack

__all__ = [
    "AgentProbe",
    "ProcessSample",
    "least_between",
    "median_between",
    "open_fds",
    "rss_mb",
]

TASKS_GAUGE = "dra_asyncio_tasks"


@dataclass(frozen=True, slots=True)
class ProcessSample:
    at_s: float
    """Seconds since the churn started (negative: before it)."""
    pid: int
    rss_mb: float
    fds: int
    tasks: int


def rss_mb(pid: int) -> float:
    """Resident set size of process `pid` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _between(
    samples: Sequence[ProcessSample], field: str, *, start_s: float, end_s: float
) -> list[float]:
    values = [float(getattr(s, field)) for s in samples if start_s <= s.at_s < end_s]
    if not values:
        raise ValueError(f"no samples between {start_s}s and {end_s}s")
    return values


def median_between(
    samples: Sequence[ProcessSample], field: str, *, start_s: float, end_s: float
) -> float:
    """The median of `field` over the samples taken in [start_s, end_s)."""
    return statistics.median(_between(samples, field, start_s=start_s, end_s=end_s))


def least_between(
    samples: Sequence[ProcessSample], field: str, *, start_s: float, end_s: float
) -> float:
    """The least `field` of the samples taken in [start_s, end_s)."""
    return min(_between(samples, field, start_s=start_s, end_s=end_s))


class AgentProbe:
    """`async with AgentProbe(stack) as probe: await probe.sample("allocation", at_s=...)`."""

    def __init__(self, stack: LocalStack) -> None:
        self._stack = stack
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        return self

    async def __aexit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self._http is not None:
            await self._http.close()

    async def tasks(self, agent: str) -> int:
        assert self._http is not None, "use `async with AgentProbe(...)`"
        async with self._http.get(self._stack.ops_url(agent)) as response:
            response.raise_for_status()
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == TASKS_GAUGE:
                    return int(sample.value)
        raise AssertionError(f"{agent} /metrics has no {TASKS_GAUGE}")

    async def sample(self, agent: str, *, at_s: float) -> ProcessSample:
        pid = self._stack.agents[agent].pid
        assert pid is not None, f"{agent} is not running"
        tasks = await self.tasks(agent)
        return ProcessSample(at_s=at_s, pid=pid, rss_mb=rss_mb(pid), fds=open_fds(pid), tasks=tasks)
