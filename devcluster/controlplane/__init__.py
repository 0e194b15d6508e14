"""The real Kubernetes control plane (kube-apiserver, kube-scheduler, kube-controller-manager,
etcd) built from the Go module proxy and run on loopback for tests and `python -m devcluster up`."""

from devcluster.controlplane.build import (
    ControlPlaneBinaries,
    ControlPlaneBuildError,
    ControlPlaneNotBuiltError,
    build,
    cached_binaries,
)
from devcluster.controlplane.cluster import ControlPlaneStartError, RealControlPlane
from devcluster.controlplane.nodes import register_node, wait_for_service_account
from devcluster.controlplane.releases import (
    NEWEST,
    OLDEST,
    RELEASES,
    KubernetesRelease,
    release,
)

__all__ = [
    "NEWEST",
    "OLDEST",
    "RELEASES",
    "ControlPlaneBinaries",
    "ControlPlaneBuildError",
    "ControlPlaneNotBuiltError",
    "ControlPlaneStartError",
    "KubernetesRelease",
    "RealControlPlane",
    "build",
    "cached_binaries",
    "register_node",
    "release",
    "wait_for_service_account",
]
