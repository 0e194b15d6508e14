"""The agents' command lines at their edges: an empty or malformed kubeconfig is a usage error
(exit 2, one message naming the file), never a traceback; `--version` answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
AGENTS = ("dra-discovery", "dra-allocation", "dra-health")
KUBECONFIGS = {
    "empty": ("", "is empty, not a kubeconfig"),
    "malformed": ("apiVersion: v1\nclusters: [oops\n", "is not valid YAML: line 3, column 1"),
    "wrong-shape": ("clusters: 5\n", "malformed kubeconfig"),
}


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("kind", sorted(KUBECONFIGS))
def test_a_bad_kubeconfig_exits_2_with_a_message(agent: str, kind: str, tmp_path: Path):
    text, expected = KUBECONFIGS[kind]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)
    argv = [str(BIN / agent), "--kubeconfig", str(kubeconfig), "--node-name", "n1"]
    argv += ["--nats-url", "nats://127.0.0.1:1", "--log-format", "console"]
    if agent == "dra-allocation":
        argv += ["--plugin-data-dir", str(tmp_path / "plugin"), "--cdi-root", str(tmp_path / "cdi")]
        argv += ["--plugin-registry-dir", str(tmp_path / "registry")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "config_invalid" in output
    assert str(kubeconfig) in output
    assert expected in output
    assert "Traceback" not in output
    assert "exc_type" not in output


@pytest.mark.parametrize("agent", AGENTS)
def test_an_agent_answers_version(agent: str):
    done = subprocess.run(
        [str(BIN / agent), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    name, version = done.stdout.split()
    assert name == agent
    assert version[0].isdigit() or version == "unknown"
