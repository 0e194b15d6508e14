"""Consumable capacity end to end on Kubernetes 1.36: every agent a real process, the emulator
serving resource.k8s.io/v1 with DRAConsumableCapacity (beta, on).

sim `gpu-shared` profile -> discovery publishes gpu-0 with `allowMultipleAllocations` and a
memory `requestPolicy` -> the devcluster scheduler gives two claims a share of gpu-0 each
(their own shareID and consumedCapacity) -> the kubelet emulator prepares both -> each CDI
spec carries its own share's memory limit -> a third claim asking more than is left of gpu-0
is not allocated.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import flow, scheduler
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import LocalStack, StackConfig
from shared.bus.session import open_bus
from shared.kube import resources
from shared.kube.client import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DRIVER = "sim.dra-suite.io"
NODE = "shared-node"
CLASS = "gpu.sim.dra-suite.io"
GPU_0 = f'device.attributes["{DRIVER}"].index == 0'
GI = 2**30

Obj = dict[str, Any]


@pytest.fixture
async def stack(short_tmp: Path) -> AsyncIterator[LocalStack]:
    config = StackConfig(
        workdir=short_tmp / "stack",
        node_name=NODE,
        driver_name=DRIVER,
        sim_profile="gpu-shared",
        kubernetes_version="1.36",
    )
    async with LocalStack(config) as running:
        yield running


async def _claim(kube: KubeClient, name: str, *, memory: str) -> Obj:
    """A claim for one GPU of which it needs `memory`, on gpu-0."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": CLASS,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "selectors": [{"cel": {"expression": GPU_0}}],
                            "capacity": {"requests": {"memory": memory}},
                        },
                    }
                ]
            }
        },
    }
    created: Obj = await kube.create(resources.RESOURCE_CLAIMS, body, namespace="default")
    return created


def _env(spec: Obj) -> dict[str, str]:
    [device] = spec["devices"]
    return dict(item.split("=", 1) for item in device["containerEdits"]["env"])


async def test_two_claims_share_one_gpu_and_a_third_does_not_fit(stack: LocalStack):
    async with open_bus(stack.nats_settings) as bus, stack.kube() as kube:
        await flow.wait_inventory(bus, driver=DRIVER, node=NODE)
        slices = await flow.wait_slices(kube, driver=DRIVER, node=NODE, devices=2)
        published = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
        assert published["gpu-0"]["allowMultipleAllocations"] is True
        assert published["gpu-0"]["capacity"]["memory"] == {
            "value": "80Gi",
            "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
        }
        assert "allowMultipleAllocations" not in published["gpu-1"]
        await flow.create_device_class(
            kube, name=CLASS, cel=f'device.attributes["{DRIVER}"].type == "gpu"'
        )

        small = await flow.allocate_as_scheduler(
            kube, await _claim(kube, "small", memory="30Gi"), node=NODE
        )
        # 39.5Gi is rounded up to the policy's 1Gi steps.
        large = await flow.allocate_as_scheduler(
            kube, await _claim(kube, "large", memory="39.5Gi"), node=NODE
        )
        results = [c["status"]["allocation"]["devices"]["results"][0] for c in (small, large)]
        assert [r["device"] for r in results] == ["gpu-0", "gpu-0"]
        assert [r["consumedCapacity"] for r in results] == [{"memory": "30Gi"}, {"memory": "40Gi"}]
        share_ids = [r["shareID"] for r in results]
        assert len(set(share_ids)) == 2

        # 10Gi of gpu-0 are left: 20Gi does not fit there (and the claim asks for gpu-0).
        too_large = await _claim(kube, "too-large", memory="20Gi")
        with pytest.raises(scheduler.UnsatisfiableError):
            await flow.allocate_as_scheduler(kube, too_large, node=NODE)
        stored = await kube.get(resources.RESOURCE_CLAIMS, "too-large", namespace="default")
        assert "allocation" not in (stored.get("status") or {})

        kubelet = KubeletEmulator(stack.config.registry_dir)
        try:
            await kubelet.register(driver=DRIVER)
            refs = [flow.kubelet_claim(c) for c in (small, large)]
            answers = (await kubelet.prepare(refs)).claims
            for ref, share_id in zip(refs, share_ids, strict=True):
                answer = answers[ref.uid]
                assert answer.error == ""
                [device] = answer.devices
                assert (device.device_name, device.share_id) == ("gpu-0", share_id)
            cdi_ids = [answers[r.uid].devices[0].cdi_device_ids[0] for r in refs]
            assert len(set(cdi_ids)) == 2

            for ref, memory in zip(refs, (30 * GI, 40 * GI), strict=True):
                spec = flow.read_cdi_spec(stack.config.cdi_root, claim_uid=ref.uid)
                assert spec is not None
                env = _env(spec)
                assert env["DRA_SUITE_CONSUMED_MEMORY"] == str(memory)
                assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={memory // 2**20}M"
                assert env["NVIDIA_VISIBLE_DEVICES"] == "0"
                assert env["DRA_SUITE_CLAIM_UID"] == ref.uid

            unprepared = (await kubelet.unprepare(refs)).claims
            assert all(unprepared[r.uid].error == "" for r in refs)
            for ref in refs:
                assert flow.read_cdi_spec(stack.config.cdi_root, claim_uid=ref.uid) is None
        finally:
            await kubelet.close()
