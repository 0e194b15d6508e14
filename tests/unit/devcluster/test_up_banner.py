"""`devcluster up` suggests commands that run as printed: the venv's scripts by their path (a
venv is on PATH only once activated), not bare names a fresh shell cannot find."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from devcluster import up
from devcluster.stack import AGENTS, StackConfig


def _banner(config: StackConfig) -> str:
    endpoints = {
        "nats_url": "nats://127.0.0.1:4222",
        "api_url": "http://127.0.0.1:6443",
        "kubeconfig": str(config.kubeconfig),
        "cdi_dir": str(config.cdi_root),
        "plugin_registry_dir": str(config.registry_dir),
        "logs_dir": str(config.logs_dir),
        "driver": config.driver_name,
        "node": config.node_name,
        "ops": dict.fromkeys(AGENTS, "http://127.0.0.1:9100"),
    }
    out = io.StringIO()
    up._print_endpoints(endpoints, config=config, out=out)
    return out.getvalue()


def test_every_suggested_command_runs_as_printed(tmp_path: Path):
    text = _banner(StackConfig(workdir=tmp_path))
    suggested = text.split("try:\n", 1)[1].splitlines()[1:-1]  # after the export line
    commands = [line.split()[0] for line in suggested]
    assert {Path(c).name for c in commands} == {"dractl", "python"}
    assert all(line.split()[1:3] == ["-m", "devcluster"] for line in suggested if "python" in line)
    for command in commands:
        assert "/" in command, f"{command} is only found on PATH"
        assert os.access(command, os.X_OK), command


def test_the_path_is_relative_below_the_working_directory():
    venv_bin = Path(sys.executable).parent.absolute()
    assert up.command_path("dractl", cwd=venv_bin.parent.parent) == str(
        Path(venv_bin.parent.name) / venv_bin.name / "dractl"
    )
    assert up.command_path("dractl", cwd=Path("/proc")) == str(venv_bin / "dractl")


def test_a_script_that_is_not_there_keeps_its_name():
    if (Path(sys.executable).parent / "no-such-script").exists():
        pytest.skip("a script of that name exists")
    assert up.command_path("no-such-script") == "no-such-script"
