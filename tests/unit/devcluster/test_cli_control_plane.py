"""`dra-suite up|demo --control-plane`: what is refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.devcluster.cli import main


def test_the_emulator_does_not_serve_1_37(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exited:
        main(["up", "--workdir", str(tmp_path), "--kubernetes-version", "1.37"])
    assert exited.value.code == 2
    assert "use --control-plane real for 1.37" in capsys.readouterr().err


def test_an_unbuilt_real_control_plane_says_how_to_build_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("DRA_SUITE_K8S_CACHE", str(tmp_path / "empty-cache"))
    argv = ["up", "--workdir", str(tmp_path / "up"), "--control-plane", "real"]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--kubernetes-version", "1.35"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "run `make k8s K8S=1.35`" in err
    assert not (tmp_path / "up").exists()
