"""Which kubelet front serves this node, and so whether its devices are published as slices.

A node served by the device-plugin front must have no ResourceSlices of our driver: the kubelet's
device manager hands its devices out, and DRA must not hand them out a second time. With
`--publish-slices auto` the Node's label `dra-suite.io/kubelet-api` decides, read once at
start (the label moves with the node's front, and the DaemonSets restart the agents with it).
"""

from __future__ import annotations

import asyncio

import structlog

from services.discovery.config import KUBELET_API_LABEL
from shared.backoff import Backoff
from shared.errors import KubeError, RecoverableError
from shared.kube.client import KubeClient
from shared.kube.resources import NODES

__all__ = ["DEVICE_PLUGIN", "publishes_slices"]

DEVICE_PLUGIN = "device-plugin"
"""The label value of nodes served by the device-plugin front."""

log = structlog.get_logger(__name__)


async def publishes_slices(client: KubeClient, *, node: str, mode: str) -> bool:
    """`true`/`false` as given; `auto`: the Node's label, retried until the Node is readable."""
    if mode != "auto":
        return mode == "true"
    backoff = Backoff(initial_s=0.2, max_s=5.0)
    while True:
        try:
            found = await client.get(NODES, node)
            break
        except (KubeError, RecoverableError) as exc:
            delay = backoff.next_delay()
            log.warning("node_lookup_failed", node=node, error=str(exc), retry_in_s=round(delay, 2))
            await asyncio.sleep(delay)
    front = str(((found.get("metadata") or {}).get("labels") or {}).get(KUBELET_API_LABEL, ""))
    log.info("kubelet_front_found", node=node, label=KUBELET_API_LABEL, front=front or "dra")
    return front != DEVICE_PLUGIN
