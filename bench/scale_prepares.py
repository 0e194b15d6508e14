"""Prepares during `make scale`: claims prepared and unprepared at an even pace through the
allocation agents' DRA gRPC sockets, as the kubelet calls them.

Before the window, for a sample of nodes (one claim each, a device picked per node): a
ResourceClaim, its allocation on that node's pool (what kube-scheduler writes) and its
reservation for a pod, and a kubelet emulator registered with that node's agent over its
registration socket. In the window (`seconds`), at `PREPARES_PER_S` over the fleet: each claim
is prepared (NodePrepareResources on the node's DRA socket: the agent reads the claim from the
API, writes CDI spec, checkpoint and metadata, publishes its prepared-claims record, and writes
the device status in the claim), then unprepared. Figures: latencies, errors, and what each
prepare-and-unprepare cost the API server and the bus. The claims are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

from bench.scale_fleet import DRIVER, Fleet, node_dir, node_name
from bench.stats import percentile
from devcluster import flow
from devcluster.kubelet import KubeletEmulator
from shared.kube import resources
from shared.kube.client import KubeClient

__all__ = ["PREPARES_PER_S", "measure"]

PREPARES_PER_S = 0.5
"""Over the whole fleet: a pod with a claim starting every 2 s."""
_NAMESPACE = "default"
_DEVICES_PER_NODE = 8
_SETUP_CONCURRENCY = 16


async def measure(fleet: Fleet, kube: KubeClient, *, seconds: float) -> dict[str, Any]:
    count = min(fleet.nodes, max(1, round(seconds * PREPARES_PER_S)))
    chosen = sorted(random.Random(11).sample(range(fleet.nodes), count))
    gate = asyncio.Semaphore(_SETUP_CONCURRENCY)

    async def ready(index: int) -> tuple[KubeletEmulator, dict[str, Any]]:
        async with gate:
            return await _claim_on(kube, fleet, index)

    staged = await asyncio.gather(*(ready(i) for i in chosen))
    try:
        await fleet.api.mark()
        claimed = {node_name(i) for i in chosen}
        msgs_before = fleet.client_msgs(claimed)
        start = time.monotonic()
        results = await asyncio.gather(
            *(
                _prepare_unprepare(kubelet, claim, at=start + n * seconds / count)
                for n, (kubelet, claim) in enumerate(staged)
            )
        )
        msgs = fleet.client_msgs(claimed)
        msgs.subtract(msgs_before)
        calls = await fleet.api.since_mark()
    finally:
        for kubelet, claim in staged:
            await kubelet.close()
            meta = claim["metadata"]
            await kube.delete(resources.RESOURCE_CLAIMS, meta["name"], namespace=meta["namespace"])
    prepare_ms = [r[0] for r in results if r[0] is not None]
    unprepare_ms = [r[1] for r in results if r[1] is not None]
    errors = [r[2] for r in results if r[2]]
    writes = sum(calls[v] for v in ("create", "update", "patch", "delete"))
    return {
        "scale_prepares": count,
        "scale_prepare_errors": len(errors),
        "scale_prepare_first_error": errors[0] if errors else "",
        "scale_prepare_p50_ms": round(percentile(prepare_ms, 50), 1) if prepare_ms else None,
        "scale_prepare_p99_ms": round(percentile(prepare_ms, 99), 1) if prepare_ms else None,
        "scale_unprepare_p50_ms": round(percentile(unprepare_ms, 50), 1) if unprepare_ms else None,
        "scale_unprepare_p99_ms": round(percentile(unprepare_ms, 99), 1) if unprepare_ms else None,
        "scale_prepare_api_requests_per_claim": round(
            (sum(calls.values()) - calls["watch"]) / count, 2
        ),
        "scale_prepare_api_writes_per_claim": round(writes / count, 2),
        "scale_prepare_nats_msgs_per_claim": {a: round(n / count, 2) for a, n in msgs.items()},
    }


async def _claim_on(
    kube: KubeClient, fleet: Fleet, index: int
) -> tuple[KubeletEmulator, dict[str, Any]]:
    """A claim allocated on node `index` and reserved for a pod, and that node's kubelet."""
    node = node_name(index)
    claim = await flow.create_claim(
        kube, namespace=_NAMESPACE, name=f"scale-{node}", device_class=DRIVER, count=1,
        cel="true",
    )  # fmt: skip
    device = f"npu-{index % _DEVICES_PER_NODE}"
    claim = await flow.allocate_claim(kube, claim, driver=DRIVER, node=node, devices=[device])
    pod = {"resource": "pods", "name": f"scale-{node}-pod", "uid": str(uuid.uuid4())}
    claim["status"] = {**claim["status"], "reservedFor": [pod]}
    claim = await kube.replace(
        resources.RESOURCE_CLAIMS, claim, namespace=_NAMESPACE, subresource="status"
    )
    kubelet = KubeletEmulator(node_dir(fleet.workdir, node) / "registry")
    await kubelet.register(driver=DRIVER)
    return kubelet, claim


async def _prepare_unprepare(
    kubelet: KubeletEmulator, claim: dict[str, Any], *, at: float
) -> tuple[float | None, float | None, str]:
    """Milliseconds to prepare and to unprepare (None: failed), and the first error."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    ref = flow.kubelet_claim(claim)
    began = time.monotonic()
    prepared = (await kubelet.prepare([ref])).claims[ref.uid]
    prepare_ms = (time.monotonic() - began) * 1000
    if prepared.error:
        return None, None, f"prepare {ref.name}: {prepared.error}"
    began = time.monotonic()
    unprepared = (await kubelet.unprepare([ref])).claims[ref.uid]
    unprepare_ms = (time.monotonic() - began) * 1000
    if unprepared.error:
        return prepare_ms, None, f"unprepare {ref.name}: {unprepared.error}"
    return prepare_ms, unprepare_ms, ""
