"""`devcluster up|demo --control-plane`: what is refused before anything starts. The CLI runs
as its own process (it configures logging for its whole process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_CLI = "from devcluster.cli import main; main()"


def _dra_suite(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CLI, *argv],
        capture_output=True, text=True, timeout=30, env={**os.environ, **(env or {})},
        check=False,
    )  # fmt: skip


def test_the_emulator_does_not_serve_1_37(tmp_path: Path):
    done = _dra_suite("up", "--workdir", str(tmp_path), "--kubernetes-version", "1.37")
    assert done.returncode == 2
    assert "use --control-plane real for 1.37" in done.stderr


def test_an_unbuilt_real_control_plane_says_how_to_build_it(tmp_path: Path):
    argv = ["up", "--workdir", str(tmp_path / "up"), "--control-plane", "real"]
    env = {"DRA_SUITE_K8S_CACHE": str(tmp_path / "empty-cache")}
    done = _dra_suite(*argv, "--kubernetes-version", "1.35", env=env)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert "run `make k8s K8S=1.35`" in done.stderr
    assert not (tmp_path / "up").exists()
