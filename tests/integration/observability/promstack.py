"""Real Prometheus and Alertmanager processes for the observability tests.

Debian packages them (`prometheus` 2.42 with `promtool`, `prometheus-alertmanager` 0.25; `.ci/run`
installs both): the binaries are looked up on PATH under Debian's and upstream's names. Each
runs on a free loopback port with its own config and storage in a temporary directory, logging
to a file there; `stop()` ends it. Without the binaries a test is skipped with a message saying
how to install them, or fails when `CI=true`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from devcluster.processes import ChildProcess

__all__ = [
    "ALERTMANAGER_NAMES",
    "RULES",
    "RULE_COPY_LABEL",
    "Alertmanager",
    "Binaries",
    "Prometheus",
    "find_binaries",
    "free_port",
    "require_binaries",
    "short_for_copy",
]

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "deploy" / "prometheus" / "dra-suite-rules.yaml"
"""The shipped alerting rules."""
RULE_COPY_LABEL = ("rules", "short-for")
"""The label the test copy of the rules adds to each of its alerts."""
ALERTMANAGER_NAMES = ("prometheus-alertmanager", "alertmanager")
"""Debian's name, then upstream's."""
INSTALL_HINT = "apt-get install -y prometheus prometheus-alertmanager (as .ci/run does)"


@dataclass(frozen=True, slots=True)
class Binaries:
    prometheus: str
    promtool: str
    alertmanager: str


def find_binaries() -> Binaries | str:
    """The three binaries, or a message naming the ones missing."""
    found = {
        "prometheus": shutil.which("prometheus"),
        "promtool": shutil.which("promtool"),
        "alertmanager": next(filter(None, map(shutil.which, ALERTMANAGER_NAMES)), None),
    }
    missing = [name for name, path in found.items() if path is None]
    if missing:
        return f"{', '.join(missing)} not on PATH: {INSTALL_HINT}"
    return Binaries(**{name: str(path) for name, path in found.items()})


def require_binaries() -> Binaries:
    """The binaries; else skip the test (locally) or fail it (CI=true)."""
    found = find_binaries()
    if isinstance(found, Binaries):
        return found
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {found}", pytrace=False)
    pytest.skip(found)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def short_for_copy(rules: Path, dest: Path) -> Path:
    """The shipped rules without their `for:` (each fires at its first true evaluation), in a
    group of its own, every alert labelled `rules=short-for`; written to `dest`."""
    doc = yaml.safe_load(rules.read_text(encoding="utf-8"))
    for group in doc["groups"]:
        group["name"] = f"{group['name']}-short-for"
        for rule in group["rules"]:
            rule.pop("for", None)
            rule.setdefault("labels", {})[RULE_COPY_LABEL[0]] = RULE_COPY_LABEL[1]
    dest.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return dest


async def _wait_ready(url: str, process: ChildProcess, *, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
        while True:
            if process.returncode is not None:
                log = process.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{process.name} exited {process.returncode}: {log}")
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{process.name} not ready within {timeout_s:.0f} s")
            await asyncio.sleep(0.1)


async def _get_json(url: str, params: dict[str, str] | None = None) -> Any:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as http,
        http.get(url, params=params) as response,
    ):
        body = await response.json()
        if response.status != 200:
            raise AssertionError(f"GET {url} {params}: {response.status} {body}")
        return body


@dataclass
class Prometheus:
    """One Prometheus scraping `targets` every `interval_s` and evaluating `rule_files`."""

    binary: str
    workdir: Path
    targets: list[str]
    rule_files: list[Path] = field(default_factory=list)
    alertmanager: str = ""
    """host:port of an Alertmanager to send the alerts to; empty: none."""
    interval_s: float = 1.0
    flags: tuple[str, ...] = ()
    """More command-line flags, e.g. `--enable-feature=exemplar-storage`."""
    port: int = 0
    process: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        interval = f"{int(self.interval_s * 1000)}ms"
        config: dict[str, Any] = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(path) for path in self.rule_files],
            # The job name of deploy/compose/prometheus.yaml; the rules and the dashboard
            # depend on no job name.
            "scrape_configs": [
                {
                    "job_name": "dra-suite",
                    "scrape_timeout": interval,
                    "static_configs": [{"targets": self.targets}],
                }
            ],
        }
        if self.alertmanager:
            config["alerting"] = {
                "alertmanagers": [{"static_configs": [{"targets": [self.alertmanager]}]}]
            }
        return config

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False), encoding="utf-8")
        self.port = free_port()
        # Debian's default --web.console.* directories need not exist: no flags for them.
        self.process = ChildProcess(
            name="prometheus",
            argv=[
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--rules.alert.resend-delay=1s",
                *self.flags,
            ],
            log_path=self.workdir / "prometheus.log",
            capture_stdout=False,
        )
        await self.process.start()
        await _wait_ready(f"{self.url}/-/ready", self.process)

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()
            self.process = None

    async def version(self) -> str:
        body = await _get_json(f"{self.url}/api/v1/status/buildinfo")
        version: str = body["data"]["version"]
        return version

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of `expr` now (each item: `metric` labels and `value`)."""
        body = await _get_json(f"{self.url}/api/v1/query", {"query": expr})
        data = body["data"]
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[dict[str, Any]] = data["result"]
        return result

    async def exemplars(self, expr: str, *, since_s: float = 600.0) -> list[dict[str, Any]]:
        """`/api/v1/query_exemplars` of `expr` over the last `since_s` (each item: the
        `seriesLabels` and its `exemplars`, each with `labels`, `value`, `timestamp`)."""
        now = time.time()
        params = {"query": expr, "start": f"{now - since_s:.3f}", "end": f"{now + 60:.3f}"}
        body = await _get_json(f"{self.url}/api/v1/query_exemplars", params)
        result: list[dict[str, Any]] = body["data"]
        return result

    async def label_values(self, label: str, match: str) -> list[str]:
        body = await _get_json(f"{self.url}/api/v1/label/{label}/values", {"match[]": match})
        values: list[str] = body["data"]
        return values

    async def targets_health(self) -> dict[str, str]:
        """Scrape URL -> up/down/unknown of every active target."""
        body = await _get_json(f"{self.url}/api/v1/targets")
        return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}

    async def rule_groups(self) -> list[dict[str, Any]]:
        body = await _get_json(f"{self.url}/api/v1/rules")
        groups: list[dict[str, Any]] = body["data"]["groups"]
        return groups

    async def alerts(self) -> list[dict[str, Any]]:
        """The pending and firing alerts (each: `labels`, `state`, `value`, ...)."""
        body = await _get_json(f"{self.url}/api/v1/alerts")
        alerts: list[dict[str, Any]] = body["data"]["alerts"]
        return alerts


@dataclass
class Alertmanager:
    """One Alertmanager (no cluster, one receiver that sends nowhere)."""

    binary: str
    workdir: Path
    port: int = 0
    process: ChildProcess | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "alertmanager.yml"
        config.write_text(
            yaml.safe_dump({"route": {"receiver": "nowhere"}, "receivers": [{"name": "nowhere"}]}),
            encoding="utf-8",
        )
        self.port = free_port()
        self.process = ChildProcess(
            name="alertmanager",
            argv=[
                self.binary,
                f"--config.file={config}",
                f"--storage.path={self.workdir / 'data'}",
                f"--web.listen-address={self.address}",
                "--cluster.listen-address=",  # no HA peers: no gossip port
            ],
            log_path=self.workdir / "alertmanager.log",
            capture_stdout=False,
        )
        await self.process.start()
        await _wait_ready(f"{self.url}/-/ready", self.process)

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()
            self.process = None

    async def alerts(self, **labels: str) -> list[dict[str, Any]]:
        """The alerts of API v2 `/api/v2/alerts` whose labels include `labels`."""
        matchers = [f'{name}="{value}"' for name, value in labels.items()]
        params = [("filter", matcher) for matcher in matchers]
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as http,
            http.get(f"{self.url}/api/v2/alerts", params=params) as response,
        ):
            assert response.status == 200, await response.text()
            alerts: list[dict[str, Any]] = await response.json()
            return alerts
