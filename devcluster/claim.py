"""`devcluster claim`: try a prepare on the stack that `devcluster up` runs.

It does what a user, kube-scheduler and the kubelet would do for one pod: create a
ResourceClaim for N devices of the driver, allocate it on the node, reserve it for a (pretend)
pod, and call NodePrepareResources through a kubelet emulator; `--release` unprepares and
deletes it. On a stack with the real control plane (`up --control-plane real`) it creates a
real pod for the claim instead: kube-scheduler allocates and binds it, and the stack's kubelet
shim prepares it; `--release` deletes the pod (the shim unprepares) and the claim. It finds
the stack through the endpoints `up` recorded in its work dir.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from devcluster import flow, workdir
from devcluster.controlplane.nodes import wait_for_service_account
from devcluster.kubelet import KubeletEmulator, KubeletError
from shared.config import KubeSettings
from shared.errors import KubeNotFoundError
from shared.kube import resources
from shared.kube.client import KubeClient

__all__ = ["ClaimHelperError", "ClaimRequest", "run_claim"]

Obj = dict[str, Any]


class ClaimHelperError(Exception):
    """What went wrong, in words for the user; printed without a traceback."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRequest:
    workdir: Path
    name: str = "try-claim"
    namespace: str = "default"
    count: int = 1
    release: bool = False


async def run_claim(request: ClaimRequest, *, out: TextIO) -> int:
    endpoints = workdir.read_endpoints(request.workdir)
    if endpoints is None:
        raise workdir.NoStackError(request.workdir)
    kube = await KubeClient.connect(KubeSettings(kubeconfig=endpoints["kubeconfig"]))
    kubelet = KubeletEmulator(Path(endpoints["plugin_registry_dir"]))
    try:
        if endpoints.get("control_plane") == "real":
            await _with_a_pod(request, endpoints=endpoints, kube=kube, out=out)
            return 0
        await kubelet.register(driver=endpoints["driver"])
        if request.release:
            await _release(request, kube=kube, kubelet=kubelet, out=out)
        else:
            await _prepare(request, endpoints=endpoints, kube=kube, kubelet=kubelet, out=out)
    except (flow.FlowError, KubeletError) as exc:
        raise ClaimHelperError(str(exc)) from exc
    finally:
        await kubelet.close()
        await kube.close()
    return 0


async def _prepare(
    request: ClaimRequest,
    *,
    endpoints: dict[str, Any],
    kube: KubeClient,
    kubelet: KubeletEmulator,
    out: TextIO,
) -> None:
    driver, node = endpoints["driver"], endpoints["node"]
    claim = await flow.create_claim(
        kube,
        namespace=request.namespace,
        name=request.name,
        device_class=driver,
        count=request.count,
        cel="true",
    )
    claim = await flow.schedule_claim(kube, claim, node=node)
    claim = await _reserve_for_pod(kube, claim)
    ref = flow.kubelet_claim(claim)
    answer = (await kubelet.prepare([ref])).claims[ref.uid]
    if answer.error:
        raise ClaimHelperError(f"prepare {request.namespace}/{request.name}: {answer.error}")
    out.write(f"claim {request.namespace}/{request.name} (uid {ref.uid}) prepared on {node}:\n")
    for device in answer.devices:
        ids = ", ".join(device.cdi_device_ids)
        out.write(f"  {device.pool_name}/{device.device_name}  CDI {ids}\n")
    spec = flow.read_cdi_spec(Path(endpoints["cdi_dir"]), claim_uid=ref.uid)
    if spec is not None:
        out.write(f"  CDI spec {spec['_path']}\n")
    out.write(_release_hint(request.name, request.workdir))


async def _reserve_for_pod(kube: KubeClient, claim: Obj) -> Obj:
    """What kube-scheduler writes for the pod that uses the claim (`status.reservedFor`)."""
    pod = {"resource": "pods", "name": f"{claim['metadata']['name']}-pod", "uid": str(uuid.uuid4())}
    claim = dict(claim)
    claim["status"] = {**claim["status"], "reservedFor": [pod]}
    return await kube.replace(
        resources.RESOURCE_CLAIMS,
        claim,
        namespace=claim["metadata"]["namespace"],
        subresource="status",
    )


async def _release(
    request: ClaimRequest, *, kube: KubeClient, kubelet: KubeletEmulator, out: TextIO
) -> None:
    claim = await kube.get(resources.RESOURCE_CLAIMS, request.name, namespace=request.namespace)
    ref = flow.kubelet_claim(claim)
    answer = (await kubelet.unprepare([ref])).claims[ref.uid]
    if answer.error:
        raise ClaimHelperError(f"unprepare {request.namespace}/{request.name}: {answer.error}")
    await kube.delete(resources.RESOURCE_CLAIMS, request.name, namespace=request.namespace)
    out.write(f"claim {request.namespace}/{request.name} unprepared and deleted\n")


_POD_WAIT_S = 60.0


async def _with_a_pod(
    request: ClaimRequest, *, endpoints: dict[str, Any], kube: KubeClient, out: TextIO
) -> None:
    """The real control plane's way: a pod that uses the claim, scheduled and prepared."""
    namespace, name, pod_name = request.namespace, request.name, f"{request.name}-pod"
    if request.release:
        with contextlib.suppress(KubeNotFoundError):
            await kube.delete(resources.PODS, pod_name, namespace=namespace)
        await flow.eventually(
            lambda: _absent(kube, pod_name, namespace), timeout_s=_POD_WAIT_S,
            what=f"pod {namespace}/{pod_name} to be released",
        )  # fmt: skip
        await kube.delete(resources.RESOURCE_CLAIMS, name, namespace=namespace)
        out.write(f"pod {namespace}/{pod_name} deleted (unprepared), claim {name} deleted\n")
        return
    await flow.create_claim(
        kube, namespace=namespace, name=name, device_class=endpoints["driver"],
        count=request.count, cel="true",
    )  # fmt: skip
    await wait_for_service_account(kube, namespace)
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name},
        "spec": {
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "devices"}]}}],
            "resourceClaims": [{"name": "devices", "resourceClaimName": name}],
        },
    }  # fmt: skip
    await kube.create(resources.PODS, pod, namespace=namespace)
    await flow.eventually(
        lambda: _running(kube, pod_name, namespace), timeout_s=_POD_WAIT_S,
        what=f"pod {namespace}/{pod_name} to be scheduled and prepared",
    )  # fmt: skip
    claim = await kube.get(resources.RESOURCE_CLAIMS, name, namespace=namespace)
    uid = claim["metadata"]["uid"]
    node = (await kube.get(resources.PODS, pod_name, namespace=namespace))["spec"]["nodeName"]
    out.write(f"pod {namespace}/{pod_name} bound to {node} by kube-scheduler and prepared:\n")
    out.write(
        f"  claim {namespace}/{name} (uid {uid}): {', '.join(flow.allocated_devices(claim))}\n"
    )
    spec = flow.read_cdi_spec(Path(endpoints["cdi_dir"]), claim_uid=uid)
    if spec is not None:
        out.write(f"  CDI spec {spec['_path']}\n")
    out.write(_release_hint(name, request.workdir))


async def _running(kube: KubeClient, name: str, namespace: str) -> bool:
    pod = await kube.get(resources.PODS, name, namespace=namespace)
    return bool((pod.get("status") or {}).get("phase") == "Running")


async def _absent(kube: KubeClient, name: str, namespace: str) -> bool:
    try:
        await kube.get(resources.PODS, name, namespace=namespace)
    except KubeNotFoundError:
        return True
    return False


def _release_hint(name: str, workdir: Path) -> str:
    return f"release it with: python -m devcluster claim {name} --release --workdir {workdir}\n"
