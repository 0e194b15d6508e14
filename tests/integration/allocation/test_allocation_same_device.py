"""One device under two admin-access requests of a claim, prepared through the kubelet emulator.

Before, the spec named the device twice and the claim failed with "device name ... is
duplicated"; now every request gets its own CDI device and the kubelet one answer per request.
"""

from __future__ import annotations

from typing import Any

import pytest

from devcluster.kubelet import KubeletClaim
from services.allocation.cdi import spec_files

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


def _admin_request(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": f"npu.{DRIVER}",
            "allocationMode": "ExactCount",
            "count": 1,
            "adminAccess": True,
        },
    }


def _allocate_twice(plugin_node, name: str, device: str) -> KubeletClaim:
    api = plugin_node.api
    # The API server admits admin access only in a namespace labelled for it (KEP-5018).
    labels = {"resource.kubernetes.io/admin-access": "true"}
    api.create_object(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default", "labels": labels}}
    )
    created = api.create_object(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [_admin_request("monitor"), _admin_request("debug")]}},
        }
    )
    results = [
        {"request": r, "driver": DRIVER, "pool": NODE, "device": device, "adminAccess": True}
        for r in ("monitor", "debug")
    ]
    created["status"] = {"allocation": {"devices": {"results": results}}}
    created = api.update_object(created, status=True)
    return KubeletClaim(namespace="default", name=name, uid=created["metadata"]["uid"])


async def test_a_device_under_two_admin_requests_is_prepared_once_per_request(plugin_node):
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.publish_inventory("npu-0", "npu-1")
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        claim = _allocate_twice(plugin_node, "inspect", "npu-0")
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert answer.error == ""
        assert [(list(d.request_names), d.device_name) for d in answer.devices] == [
            (["monitor"], "npu-0"),
            (["debug"], "npu-0"),
        ]
        spec = plugin_node.spec(claim.uid)
        assert spec is not None
        assert spec_files.validate(spec) == []
        spec_ids = {spec_files.device_id(DRIVER, device["name"]) for device in spec["devices"]}
        answered = [id_ for d in answer.devices for id_ in d.cdi_device_ids]
        assert len(set(answered)) == 2
        assert set(answered) == spec_ids
        assert (await kubelet.prepare([claim])).claims[claim.uid] == answer
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert plugin_node.spec(claim.uid) is None
