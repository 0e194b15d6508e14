"""Building kube-apiserver, kube-scheduler, kube-controller-manager and etcd from their Go
modules into a cache outside the repository, once per machine.

A build lives in `<cache>/<what>-<key>/` where the key hashes everything that decides the
binaries: the module's go.mod and go.sum (and etcd's main.go), the ldflags and the Go toolchain.
A build is written to a temporary directory and renamed into place, so a reader never sees half
of one and an interrupted build leaves nothing that looks finished. Fixtures only look builds
up (`cached_binaries`); `make k8s` and `.ci/run` build (`python -m
devcluster.controlplane`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devcluster.controlplane.releases import (
    COMPONENTS,
    ETCD_MODULE,
    NEWEST,
    RELEASES,
    KubernetesRelease,
    release,
    tools_dir,
)

__all__ = [
    "ControlPlaneBinaries",
    "ControlPlaneBuildError",
    "ControlPlaneNotBuiltError",
    "build",
    "cache_root",
    "cached_binaries",
    "find_go",
    "main",
]

_BUILD_RECORD = "build.json"


class ControlPlaneBuildError(RuntimeError):
    """Go is missing or `go build` failed; the message says which and where the log is."""


class ControlPlaneNotBuiltError(RuntimeError):
    """The binaries for a release are not in the cache; the message says how to build them."""


@dataclass(frozen=True, slots=True)
class ControlPlaneBinaries:
    release: KubernetesRelease
    kubernetes_dir: Path
    etcd_dir: Path

    def path(self, component: str) -> Path:
        """The binary of `component` (one of COMPONENTS, or "etcd")."""
        if component == "etcd":
            return self.etcd_dir / "etcd"
        if component not in COMPONENTS:
            raise ValueError(f"unknown control-plane component {component!r}")
        return self.kubernetes_dir / component

    def build_seconds(self) -> dict[str, float]:
        """How long each cached build took when it was made (its build record)."""
        return {
            "kubernetes": _record(self.kubernetes_dir).get("build_s", 0.0),
            "etcd": _record(self.etcd_dir).get("build_s", 0.0),
        }


def cache_root() -> Path:
    """`$DRA_SUITE_K8S_CACHE`, else `$XDG_CACHE_HOME/dra-suite/k8s`, else `~/.cache/...`."""
    explicit = os.environ.get("DRA_SUITE_K8S_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dra-suite" / "k8s"


def find_go() -> str | None:
    """The `go` command on PATH (or `$GO`), or None when this machine has no Go."""
    explicit = os.environ.get("GO")
    if explicit and os.access(explicit, os.X_OK):
        return explicit
    return shutil.which("go") or next(
        (p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if os.access(p, os.X_OK)), None
    )


def cached_binaries(target: KubernetesRelease) -> ControlPlaneBinaries:
    """The cached build of `target`; ControlPlaneNotBuiltError when it is missing or stale."""
    go = find_go()
    if go is None:
        raise ControlPlaneNotBuiltError(
            "no Go toolchain on this machine: the real control plane is built from Go modules "
            f"(install Go 1.26+, then `make k8s K8S={target.minor}`)"
        )
    toolchain = _go_version(go)
    binaries = ControlPlaneBinaries(
        target,
        cache_root() / f"kubernetes-{target.version}-{_kubernetes_key(target, toolchain)}",
        cache_root() / f"etcd-{_etcd_key(toolchain)}",
    )
    missing = [
        p for p in (*map(binaries.path, COMPONENTS), binaries.path("etcd")) if not p.exists()
    ]
    if missing:
        raise ControlPlaneNotBuiltError(
            f"Kubernetes {target.version} is not built on this machine (no {missing[0]}): "
            f"run `make k8s K8S={target.minor}`"
        )
    return binaries


def build(target: KubernetesRelease, *, log: Path | None = None) -> ControlPlaneBinaries:
    """Build what the cache lacks for `target` (and etcd) and return the binaries."""
    go = find_go()
    if go is None:
        raise ControlPlaneBuildError("no Go toolchain on this machine (`go` not on PATH)")
    toolchain = _go_version(go)
    kubernetes_dir = (
        cache_root() / f"kubernetes-{target.version}-{_kubernetes_key(target, toolchain)}"
    )
    etcd_dir = cache_root() / f"etcd-{_etcd_key(toolchain)}"
    packages = [f"k8s.io/kubernetes/cmd/{c}" for c in COMPONENTS]
    _build_into(go, kubernetes_dir, target.module_dir, packages, target.ldflags, log=log)
    _build_into(go, etcd_dir, tools_dir() / ETCD_MODULE, ["."], "-s -w", log=log)
    return ControlPlaneBinaries(target, kubernetes_dir, etcd_dir)


def _build_into(
    go: str, target: Path, module: Path, packages: list[str], ldflags: str, *, log: Path | None
) -> None:
    if (target / _BUILD_RECORD).exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    log_path = log or target.with_name(f"{target.name}.log")
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"}
    argv = [go, "build", "-trimpath", "-ldflags", ldflags, "-o", f"{staging}/", *packages]
    started = time.monotonic()
    try:
        with log_path.open("ab") as sink:
            sink.write(f"$ (cd {module} && {' '.join(argv)})\n".encode())
            sink.flush()
            done = subprocess.run(argv, cwd=module, env=env, stdout=sink, stderr=sink, check=False)
        if done.returncode != 0:
            raise ControlPlaneBuildError(
                f"go build in {module} failed (exit {done.returncode}); see {log_path}"
            )
        record = {"build_s": round(time.monotonic() - started, 1), "module": module.name}
        (staging / _BUILD_RECORD).write_text(json.dumps(record) + "\n")
        staging.replace(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _go_version(go: str) -> str:
    return subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout


def _digest(*parts: bytes) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(len(part).to_bytes(8, "big"))
        hasher.update(part)
    return hasher.hexdigest()[:12]


def _module_bytes(module: Path, *names: str) -> list[bytes]:
    return [(module / name).read_bytes() for name in names]


def _kubernetes_key(target: KubernetesRelease, toolchain: str) -> str:
    module = _module_bytes(target.module_dir, "go.mod", "go.sum")
    return _digest(*module, target.ldflags.encode(), toolchain.encode())


def _etcd_key(toolchain: str) -> str:
    module = _module_bytes(tools_dir() / ETCD_MODULE, "go.mod", "go.sum", "main.go")
    return _digest(*module, toolchain.encode())


def _record(directory: Path) -> dict[str, float]:
    try:
        loaded = json.loads((directory / _BUILD_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in loaded.items() if isinstance(v, int | float)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devcluster.controlplane",
        description="Build (or find cached) kube-apiserver, kube-scheduler, "
        "kube-controller-manager and etcd for one or more Kubernetes minors.",
    )
    parser.add_argument(
        "versions",
        nargs="*",
        default=[NEWEST],
        help=f"minors to build: {', '.join(RELEASES)} or 'all' (default {NEWEST})",
    )
    parser.add_argument(
        "--if-go", action="store_true", help="exit 0 with one line when this machine has no Go"
    )
    args = parser.parse_args(argv)
    if find_go() is None:
        print("no Go toolchain: the real control plane is not built", file=sys.stderr)
        return 0 if args.if_go else 1
    wanted = list(RELEASES) if args.versions == ["all"] else args.versions
    try:
        for version in wanted:
            target = release(version)
            started = time.monotonic()
            binaries = build(target)
            took = time.monotonic() - started
            print(f"Kubernetes {target.version}: {binaries.kubernetes_dir} ({took:.0f} s)")
    except (ValueError, ControlPlaneBuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
