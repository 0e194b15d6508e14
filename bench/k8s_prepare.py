"""`real_prepare_p99_ms`: a pod bound by kube-scheduler to prepared, on the real control plane.

The stack runs as in `python -m devcluster up --control-plane real` (the agents as processes against
kube-apiserver, kube-scheduler and kube-controller-manager of the newest built minor); this
process plays the kubelet through the kubelet shim. Each sample is one pod with a one-GPU claim:
`real_prepare` runs from the shim seeing the pod bound to the node to the plugin's answer
(reading the claims from the API server, NodePrepareResources over gRPC: what a kubelet does),
`real_schedule_to_prepared` from the pod's creation (kube-scheduler's allocation and binding
included). Pods go one at a time, each released before the next.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.stats import percentile
from devcluster import flow
from devcluster.controlplane import NEWEST
from devcluster.controlplane.kubeletshim import KubeletShim
from devcluster.controlplane.nodes import wait_for_service_account
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import LocalStack, StackConfig
from shared.errors import KubeNotFoundError
from shared.kube import resources
from shared.kube.client import KubeClient

__all__ = ["measure_real_prepare"]

_NAMESPACE = "default"


async def measure_real_prepare(workdir: Path, *, pods: int = 40) -> dict[str, Any]:
    config = StackConfig(
        workdir=workdir, control_plane="real", kubernetes_version=NEWEST, sim_profile="gpu"
    )
    prepare_ms: list[float] = []
    end_to_end_ms: list[float] = []
    async with LocalStack(config) as stack, stack.kube() as kube:
        driver = config.driver_name
        await flow.create_device_class(kube, name=driver, cel=f'device.driver == "{driver}"')
        kubelet = KubeletEmulator(config.registry_dir)
        try:
            await kubelet.register(driver=driver, timeout_s=30)
            await stack.wait_agents_ready()
            await wait_for_service_account(kube, _NAMESPACE)
            async with KubeletShim(kube, kubelet, node=config.node_name, driver=driver) as shim:
                for i in range(pods):
                    created, record = await _one_pod(kube, shim, f"bench-{i}", driver=driver)
                    prepare_ms.append((record.prepared_at - record.seen_at) * 1000)
                    end_to_end_ms.append((record.prepared_at - created) * 1000)
        finally:
            await kubelet.close()
    return {
        "real_prepare_p50_ms": round(percentile(prepare_ms, 50), 2),
        "real_prepare_p99_ms": round(percentile(prepare_ms, 99), 2),
        "real_schedule_to_prepared_p50_ms": round(percentile(end_to_end_ms, 50), 2),
        "real_schedule_to_prepared_p99_ms": round(percentile(end_to_end_ms, 99), 2),
        "real_prepare_samples": len(prepare_ms),
        "real_prepare_version": NEWEST,
    }


async def _one_pod(kube: KubeClient, shim: KubeletShim, name: str, *, driver: str) -> Any:
    await flow.create_claim(
        kube, namespace=_NAMESPACE, name=name, device_class=driver, count=1, cel="true"
    )
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }  # fmt: skip
    created = time.monotonic()
    await kube.create(resources.PODS, pod, namespace=_NAMESPACE)
    key = f"{_NAMESPACE}/{name}"
    async with asyncio.timeout(60):
        while True:
            shim.changed.clear()
            if key in shim.pods and shim.pods[key].prepared_at:
                break
            await shim.changed.wait()
    record = shim.pods[key]
    await kube.delete(resources.PODS, name, namespace=_NAMESPACE)
    async with asyncio.timeout(60):
        while True:
            try:
                await kube.get(resources.PODS, name, namespace=_NAMESPACE)
            except KubeNotFoundError:
                break
            await asyncio.sleep(0.02)
    await kube.delete(resources.RESOURCE_CLAIMS, name, namespace=_NAMESPACE)
    return created, record
