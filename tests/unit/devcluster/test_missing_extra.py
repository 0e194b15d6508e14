"""Without the devcluster extra, every entry point that needs it says so in one line (what is
missing and how to install it), before it starts anything; no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster import extra

REPO = Path(__file__).resolve().parents[3]
_DEVCLUSTER = (sys.executable, "-m", "devcluster")


@pytest.fixture
def without_the_extra(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import kubernetes_validate` fails, as when it is not installed."""
    shadow = tmp_path / "shadow" / "kubernetes_validate"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'kubernetes_validate'\", "
        'name="kubernetes_validate")\n'
    )
    path = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _one_line(done: subprocess.CompletedProcess[str], prog: str) -> None:
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"{prog}: the API emulator's schemas needs kubernetes-validate")
    assert extra.DEVCLUSTER_INSTALL in done.stderr


@pytest.mark.parametrize("command", ["demo", "up"])
def test_demo_and_up_say_what_is_missing_in_one_line(
    command: str, without_the_extra: dict[str, str], tmp_path: Path
):
    workdir = tmp_path / "stack"
    done = subprocess.run(
        [*_DEVCLUSTER, command, "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=without_the_extra,
        cwd=REPO,
    )
    _one_line(done, "devcluster")
    assert not workdir.exists()  # nothing was started


def test_the_emulator_alone_says_it_too(without_the_extra: dict[str, str]):
    done = subprocess.run(
        [sys.executable, "-m", "devcluster.apiserver", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=without_the_extra,
        cwd=REPO,
    )
    _one_line(done, "apiserver")


def test_require_passes_when_the_module_imports():
    extra.require("json", "json", "nothing")
    with pytest.raises(extra.MissingExtraError, match="part of the devcluster extra"):
        extra.require("no_such_module_here", "no-such-package", "a test")
