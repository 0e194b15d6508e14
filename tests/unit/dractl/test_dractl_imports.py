"""dractl builds its parser and parses any command line without the allocator, CEL or the
Kubernetes client: only `explain` and `classes` load them, when they run."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

HEAVY = ("kubernetes_asyncio", "celpy", "services.allocator")

# Runs in a fresh interpreter, so that what this test process imported does not count.
_PARSE = """
import contextlib, io, json, sys
from services.dractl import cli

heavy, argv = sys.argv[1].split(","), sys.argv[2:]
printed = io.StringIO()
with contextlib.redirect_stdout(printed), contextlib.suppress(SystemExit):
    cli._parser().parse_args(argv)
loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
print(json.dumps({"loaded": loaded, "printed": printed.getvalue()}))
"""


def _parse(argv: list[str]) -> dict[str, Any]:
    """The heavy modules loaded after building dractl's parser and parsing `argv`, and what
    parsing printed (the help)."""
    result = subprocess.run(
        [sys.executable, "-c", _PARSE, ",".join(HEAVY), *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    outcome: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return outcome


@pytest.mark.parametrize(
    "argv",
    [
        ["inventory", "-o", "json"],
        ["health", "--all-nodes"],
        ["alerts"],
        ["completion", "bash"],
        ["explain", "my-claim", "--node", "node-a"],
        ["classes", "generate", "--kubernetes-version", "1.36", "--backend", "a.example=sim"],
    ],
    ids=lambda argv: argv[0],
)
def test_parsing_a_command_line_loads_no_heavy_module(argv: list[str]) -> None:
    assert _parse(argv)["loaded"] == []


@pytest.mark.parametrize("command", ["explain", "classes"])
def test_the_help_of_the_heavy_commands_loads_no_heavy_module(command: str) -> None:
    outcome = _parse([command, "--help"])
    assert outcome["printed"].startswith(f"usage: dractl {command} ")
    assert "--kubeconfig" in outcome["printed"]
    assert outcome["loaded"] == []


def test_the_classes_help_lists_the_backends_of_the_shipped_drivers() -> None:
    printed = " ".join(_parse(["classes", "--help"])["printed"].split())
    assert "sim.dra-suite.io=sim, gpu.dra-suite.io=nvml, npu.huawei.com=ascend" in printed
