"""The release table and the committed Go modules describe the same builds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devcluster.controlplane import releases
from devcluster.controlplane.build import (
    ControlPlaneNotBuiltError,
    cache_root,
    cached_binaries,
)
from devcluster.controlplane.releases import RELEASES, release, tools_dir

_REPLACE = re.compile(r"^\s*(k8s\.io/[\w.-]+) => (k8s\.io/[\w.-]+) (v[\w.-]+)$", re.M)


@pytest.mark.parametrize("minor", list(RELEASES))
def test_each_module_pins_kubernetes_and_every_staging_module_at_the_release(minor: str):
    target = RELEASES[minor]
    go_mod = (target.module_dir / "go.mod").read_text()
    pinned = rf"^\s*(require )?k8s\.io/kubernetes {re.escape(target.version)}( // indirect)?$"
    assert re.search(pinned, go_mod, re.M)
    replaced = _REPLACE.findall(go_mod)
    assert len(replaced) >= 30, "every staging module is pinned"
    for source, destination, version in replaced:
        assert source == destination
        assert version == target.staging_version, f"{source} pinned at {version}"
    for tool in ("kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        assert f"k8s.io/kubernetes/cmd/{tool}" in go_mod
    assert (target.module_dir / "go.sum").stat().st_size > 0


def test_the_etcd_module_is_its_own():
    module = tools_dir() / releases.ETCD_MODULE
    assert "go.etcd.io/etcd/server/v3" in (module / "go.mod").read_text()
    assert "etcdmain.Main(os.Args)" in (module / "main.go").read_text()


def test_versions_are_looked_up_by_minor_and_stamped():
    assert release("v1.36.9") is RELEASES["1.36"]
    assert release("1.37") is RELEASES[releases.NEWEST]
    assert (releases.OLDEST, releases.NEWEST) == ("1.34", "1.37")
    flags = RELEASES["1.37"].ldflags
    assert "-X k8s.io/component-base/version.gitVersion=v1.37.2" in flags
    assert "-X k8s.io/client-go/pkg/version.gitMinor=37" in flags
    with pytest.raises(ValueError, match=r"1\.33.*1\.34, 1\.35, 1\.36, 1\.37"):
        release("1.33")


def test_a_missing_build_says_how_to_make_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DRA_SUITE_K8S_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    with pytest.raises(ControlPlaneNotBuiltError, match=r"make k8s K8S=1\.35"):
        cached_binaries(RELEASES["1.35"])
