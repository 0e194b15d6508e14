"""`devcluster up` as a real process tree: every way of stopping it stops everything in order.

Ctrl-C (SIGINT to the whole process group), SIGTERM and SIGHUP to `devcluster up`: each agent
exits 0 within 2 s of its stop, nothing outlives the stack, and the logs stay JSON. A second
stack on the same work dir is refused and leaves the first one running. A running stack is
ready for `devcluster claim`, and `dractl claims` shows what it prepared. A demo stopped half-way
stops its own stack the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from devcluster.stack import AGENTS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

_READY = "stops everything"
_DEVCLUSTER = (sys.executable, "-m", "devcluster")  # as the README runs it, from the repo root
_DRACTL = str(Path(sys.executable).parent / "dractl")


class _Up:
    """One `devcluster up` in a session (so a process group) of its own."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.stdout_path = workdir.parent / "up.out"
        self.stderr_path = workdir.parent / "up.err"
        with self.stdout_path.open("w") as stdout, self.stderr_path.open("w") as stderr:
            self.process = subprocess.Popen(
                [*_DEVCLUSTER, "up", "--workdir", str(workdir)],
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )

    def agent_log_tails(self) -> str:
        """The last lines of each agent's log, for a failure message."""
        tails = []
        for log in sorted(self.workdir.glob("**/*.log")):
            lines = log.read_text(errors="replace").splitlines()[-5:]
            tails.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n" + "\n".join(tails)

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while _READY not in self.stdout_path.read_text():
            assert self.process.poll() is None, self.stderr_path.read_text()
            assert time.monotonic() < deadline, self.stdout_path.read_text()
            time.sleep(0.2)

    def descendants(self) -> set[int]:
        return self.descendants_of(self.process.pid)

    @staticmethod
    def descendants_of(root: int) -> set[int]:
        """Every process started under `root` (children of children included)."""
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except (FileNotFoundError, ProcessLookupError):
                    continue
                parents[int(entry.name)] = int(fields[1])
        found, frontier = set(), {root}
        while frontier:
            frontier = {pid for pid, parent in parents.items() if parent in frontier}
            found |= frontier
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


@pytest.fixture
def up(short_tmp: Path) -> Iterator[_Up]:
    stack = _Up(short_tmp / "up")
    try:
        yield stack
    finally:
        stack.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _log_records(path: Path) -> list[dict[str, object]]:
    lines = path.read_text().splitlines()
    assert lines, f"{path} is empty"
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"{path.name} has a line that is not JSON: {line!r}")
    return records


def _stop_took_s(records: list[dict[str, object]]) -> float:
    times = {r["event"]: datetime.fromisoformat(str(r["timestamp"])) for r in records}
    return (times["agent_stopped"] - times["shutdown_requested"]).total_seconds()


@pytest.mark.parametrize(
    ("sig", "to_group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGHUP, False)],
    ids=["ctrl-c-to-the-group", "sigterm", "sighup"],
)
def test_every_stop_signal_stops_agents_then_the_bus_cleanly(
    up: _Up, sig: signal.Signals, to_group: bool
) -> None:
    up.wait_ready()
    started = up.descendants()
    assert len(started) >= 5, started  # nats-server, the API emulator, three agents

    if to_group:
        os.killpg(up.process.pid, sig)
    else:
        up.process.send_signal(sig)
    # `up` prints "<agent> exited <code>" on stdout; with the agents' logs, it says who failed.
    assert up.process.wait(15) == 0, (
        up.stdout_path.read_text()[-2000:] + up.stderr_path.read_text() + up.agent_log_tails()
    )

    assert not [pid for pid in started if _alive(pid)], "processes outlived the stack"
    assert "discovery exited 0, allocation exited 0, health exited 0" in (
        up.stdout_path.read_text()
    )
    for agent in AGENTS:
        records = _log_records(up.workdir / "logs" / f"{agent}.log")
        assert records[-1]["event"] == "agent_stopped"
        assert records[-1]["exit_code"] == 0
        assert _stop_took_s(records) < 2.0
        assert not [r for r in records if r["level"] == "error"], agent


def test_a_demo_on_the_work_dir_of_a_running_stack_is_refused_and_harms_nothing(
    up: _Up,
) -> None:
    up.wait_ready()
    demo = subprocess.run(
        [*_DEVCLUSTER, "demo", "--workdir", str(up.workdir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert demo.returncode == 1
    assert "in use by another dra-suite stack" in demo.stderr
    assert f"pid {up.process.pid}" in demo.stderr

    assert up.process.poll() is None
    assert (up.workdir / "kubeconfig.yaml").exists()
    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(15) == 0
    assert "health exited 0" in up.stdout_path.read_text()


def test_up_is_ready_for_a_claim_and_dractl_reads_it(up: _Up) -> None:
    up.wait_ready()
    endpoints = json.loads((up.workdir / "endpoints.json").read_text())
    with urllib.request.urlopen(f"{endpoints['ops']['allocation']}/readyz", timeout=5) as ready:
        assert ready.status == 200  # the kubelet emulator registered the plugin

    claim = _run(*_DEVCLUSTER, "claim", "--count", "2", "--workdir", str(up.workdir))
    assert claim.returncode == 0, claim.stderr
    assert "prepared on demo-node" in claim.stdout
    assert claim.stdout.count("CDI k8s.sim.dra-suite.io/claim=") == 2

    env = {**os.environ, "NATS_URL": endpoints["nats_url"], "NODE_NAME": endpoints["node"]}
    listed = _run(_DRACTL, "claims", "--node", "demo-node", "-o", "json", env=env)
    assert listed.returncode == 0, listed.stderr
    [prepared] = json.loads(listed.stdout)
    assert (prepared["namespace"], prepared["name"], prepared["state"]) == (
        "default",
        "try-claim",
        "PREPARED",
    )
    assert [pod["name"] for pod in prepared["pods"]] == ["try-claim-pod"]
    assert len(prepared["devices"]) == 2

    released = _run(*_DEVCLUSTER, "claim", "--release", "--workdir", str(up.workdir))
    assert released.returncode == 0, released.stderr
    assert not list((up.workdir / "cdi").iterdir())
    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(15) == 0


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)


def test_a_demo_stopped_half_way_stops_its_stack_and_says_so(short_tmp: Path) -> None:
    out_path = short_tmp / "demo.out"
    with out_path.open("w") as out:
        demo = subprocess.Popen(
            [*_DEVCLUSTER, "demo", "--workdir", str(short_tmp / "demo")],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while "[2]" not in out_path.read_text():  # the stack is up, the walk has begun
            assert demo.poll() is None, out_path.read_text()
            assert time.monotonic() < deadline, out_path.read_text()
            time.sleep(0.1)
        started = _Up.descendants_of(demo.pid)
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(20) == 130
        assert "interrupted; everything stopped" in out_path.read_text()
        assert not [pid for pid in started if _alive(pid)], "processes outlived the demo"
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)


def _using(workdir: Path) -> set[int]:
    """Every process whose command line names a path under `workdir`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(str(workdir) in arg for arg in argv):
                found.add(int(entry.name))
    return found


def test_after_a_sigkill_the_next_stack_names_the_orphans_and_starts_nothing(up: _Up) -> None:
    """`kill -9` of `devcluster up` leaves its children running (each in a process group of its
    own); the next `up` on the work dir must not start a second nats-server on their store."""
    up.wait_ready()
    started = up.descendants()
    up.process.kill()
    up.process.wait(10)
    orphans = {pid for pid in started if _alive(pid)}
    try:
        assert len(orphans) >= 5, "nats-server, the API emulator and three agents live on"
        second = _run(*_DEVCLUSTER, "up", "--workdir", str(up.workdir))
        assert second.returncode == 1, second.stdout + second.stderr
        assert f"(pid {up.process.pid}) was killed without stopping its processes" in (
            second.stderr
        )
        listed = second.stderr.split("they still run: ", 1)[1].split(". Stop", 1)[0]
        named = {name: int(pid) for name, pid in re.findall(r"([\w-]+) \(pid (\d+)\)", listed)}
        assert set(named) == {"nats-server", "apiserver", *AGENTS}
        assert set(named.values()) <= orphans
        assert f"`kill {' '.join(str(pid) for pid in named.values())}`" in second.stderr
        assert "Traceback" not in second.stderr
        assert (up.workdir / "kubeconfig.yaml").exists()  # nothing of theirs was wiped
        assert _using(up.workdir) <= orphans  # no second nats-server, no second agent
    finally:
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
