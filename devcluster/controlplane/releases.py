"""The Kubernetes releases the real control plane is built from, one per supported minor.

Each minor has a Go module of ours under `tools/k8s/v<minor>/` that pins `k8s.io/kubernetes`
at `version` and its staging modules at the matching `v0.<minor>.<patch>`; a test holds the two
together. The gates and runtime config are the version's defaults plus what the tests need on
top, the same choice `ClusterConfig.for_tests` makes for the API emulator: the DRA device-taint
API where the version has it behind a gate or an alpha/beta API version. No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

__all__ = [
    "COMPONENTS",
    "ETCD_MODULE",
    "NEWEST",
    "OLDEST",
    "RELEASES",
    "KubernetesRelease",
    "release",
    "tools_dir",
]

COMPONENTS = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
"""The binaries built from `k8s.io/kubernetes/cmd/<name>` for every minor."""


def tools_dir() -> Path:
    """`tools/k8s/` of this checkout (the Go modules are not part of the wheel)."""
    return Path(__file__).resolve().parents[2] / "tools" / "k8s"


@dataclass(frozen=True, slots=True)
class KubernetesRelease:
    minor: str
    """"1.34" ... "1.37"."""
    version: str
    """The exact `k8s.io/kubernetes` module version, "v1.37.2"."""
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    """Turned on for kube-apiserver, kube-scheduler and kube-controller-manager alike."""
    runtime_config: tuple[str, ...] = ()
    """API versions off by default that the flows need (`group/version=true`)."""

    @property
    def staging_version(self) -> str:
        """`v0.<minor>.<patch>`: the version every `k8s.io/<staging>` module is published at."""
        _, minor, patch = self.version.removeprefix("v").split(".")
        return f"v0.{minor}.{patch}"

    @property
    def minor_number(self) -> int:
        return int(self.minor.split(".")[1])

    @property
    def module_dir(self) -> Path:
        return tools_dir() / f"v{self.minor}"

    @property
    def ldflags(self) -> str:
        """Stamp the version, or `/version` answers `v0.0.0-master` and clients misjudge it."""
        minor = str(self.minor_number)
        stamps = {"gitVersion": self.version, "gitMajor": "1", "gitMinor": minor}
        stamps["gitTreeState"] = "clean"
        flags = ["-s", "-w"]
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
            flags += [f"-X {package}.{name}={value}" for name, value in stamps.items()]
        return " ".join(flags)

    def gates_flag(self) -> str:
        return ",".join(
            f"{name}={str(on).lower()}" for name, on in sorted(self.feature_gates.items())
        )


_RESOURCE = "resource.k8s.io"

RELEASES: Mapping[str, KubernetesRelease] = MappingProxyType(
    {
        # DeviceTaintRule is v1alpha3 behind DRADeviceTaints (alpha).
        "1.34": KubernetesRelease(
            "1.34",
            "v1.34.4",
            MappingProxyType({"DRADeviceTaints": True}),
            (f"{_RESOURCE}/v1alpha3=true",),
        ),
        # 1.35 splits the rules off into DRADeviceTaintRules (alpha).
        "1.35": KubernetesRelease(
            "1.35",
            "v1.35.4",
            MappingProxyType({"DRADeviceTaints": True, "DRADeviceTaintRules": True}),
            (f"{_RESOURCE}/v1alpha3=true",),
        ),
        # Taints are beta and on; the rules are beta but off, served as v1beta2 (beta API
        # versions of resource.k8s.io are off by default).
        "1.36": KubernetesRelease(
            "1.36",
            "v1.36.3",
            MappingProxyType({"DRADeviceTaintRules": True}),
            (f"{_RESOURCE}/v1beta2=true",),
        ),
        # Device taints and DeviceTaintRule are GA in resource.k8s.io/v1.
        "1.37": KubernetesRelease("1.37", "v1.37.2"),
    }
)

OLDEST = min(RELEASES, key=lambda minor: RELEASES[minor].minor_number)
NEWEST = max(RELEASES, key=lambda minor: RELEASES[minor].minor_number)

ETCD_MODULE = "etcd"
"""`tools/k8s/etcd/`: etcd's server behind a three-line main, in a module of its own so etcd's
and Kubernetes' gRPC and OpenTelemetry versions never meet in one build."""


def release(version: str) -> KubernetesRelease:
    """The release for "1.36", "v1.36" or "1.36.3"; ValueError naming the supported ones."""
    parts = version.removeprefix("v").split(".")
    minor = ".".join(parts[:2])
    if minor not in RELEASES:
        supported = ", ".join(RELEASES)
        raise ValueError(f"Kubernetes {version!r} is not supported: pick one of {supported}")
    return RELEASES[minor]
