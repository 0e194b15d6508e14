"""MIG partitions made on demand, end to end on Kubernetes 1.36: every agent a real process.

sim `gpu-mig` profile -> discovery publishes each GPU whole and its MIG placements as options
(`createdOnDemand: true`, consuming the GPU's shared counters) -> the devcluster scheduler
allocates two claims selecting `profile == "1g.10gb"` -> the kubelet emulator prepares them ->
the allocation agent's sim partition manager makes a 1g.10gb partition of the parent GPU at
each option's placement (in `sim-partitions.json`) -> each CDI spec gives its container the
partition's MIG device, not the GPU -> unprepare removes the partitions and the specs.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import flow
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import LocalStack, StackConfig
from shared.bus.session import open_bus
from shared.kube.client import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DRIVER = "sim.dra-suite.io"
NODE = "mig-node"
CLASS = "mig.sim.dra-suite.io"
ONE_G = f'device.attributes["{DRIVER}"].profile == "1g.10gb"'
DEVICES = 4 * (1 + 7 + 3 + 2 + 1)  # each GPU whole + its 1g, 2g, 3g and 7g placements
OPTION = re.compile(r"^(gpu-\d)-mig-1g10gb-19-(\d)$")

Obj = dict[str, Any]


@pytest.fixture
async def stack(short_tmp: Path) -> AsyncIterator[LocalStack]:
    config = StackConfig(
        workdir=short_tmp / "stack",
        node_name=NODE,
        driver_name=DRIVER,
        sim_profile="gpu-mig",
        kubernetes_version="1.36",
    )
    async with LocalStack(config) as running:
        yield running


async def _schedule(kube: KubeClient, name: str) -> Obj:
    """Create a claim for one 1g.10gb MIG device and allocate it as kube-scheduler would,
    against the node's slices and every allocation already made."""
    claim = await flow.create_claim(
        kube, namespace="default", name=name, device_class=CLASS, count=1, cel=ONE_G
    )
    return await flow.allocate_as_scheduler(kube, claim, node=NODE)


def _sim_partitions(stack: LocalStack) -> list[Obj]:
    path = stack.config.plugin_data_dir / "sim-partitions.json"
    if not path.exists():
        return []
    entries: list[Obj] = json.loads(path.read_text())["partitions"]
    return entries


def _env(spec: Obj) -> dict[str, str]:
    [device] = spec["devices"]
    return dict(item.split("=", 1) for item in device["containerEdits"]["env"])


async def test_claims_for_a_mig_profile_get_partitions_made_at_their_placements(
    stack: LocalStack,
):
    async with open_bus(stack.nats_settings) as bus, stack.kube() as kube:
        await flow.wait_inventory(bus, driver=DRIVER, node=NODE)
        slices = await flow.wait_slices(kube, driver=DRIVER, node=NODE, devices=DEVICES)
        published = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
        option = published["gpu-0-mig-1g10gb-19-3"]
        assert option["attributes"]["createdOnDemand"] == {"bool": True}
        assert option["attributes"]["profile"] == {"string": "1g.10gb"}
        assert option["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set"
        await flow.create_device_class(
            kube, name=CLASS, cel=f'device.attributes["{DRIVER}"].type == "mig"'
        )

        claims = [await _schedule(kube, name) for name in ("first", "second")]
        allocated = [flow.allocated_devices(c) for c in claims]
        matches = [OPTION.match(device) for [device] in allocated]
        assert all(matches), allocated
        # (parent GPU, placement) the scheduler handed each claim, as the option names them.
        wanted = [(m.group(1), int(m.group(2))) for m in matches if m is not None]
        assert len(set(wanted)) == 2

        kubelet = KubeletEmulator(stack.config.registry_dir)
        try:
            await kubelet.register(driver=DRIVER)
            refs = [flow.kubelet_claim(c) for c in claims]
            answers = (await kubelet.prepare(refs)).claims
            for ref, devices in zip(refs, allocated, strict=True):
                assert answers[ref.uid].error == ""
                assert [d.device_name for d in answers[ref.uid].devices] == devices

            entries = {e["claimUID"]: e for e in _sim_partitions(stack)}
            assert sorted(entries) == sorted(r.uid for r in refs)
            for ref, (parent, placement) in zip(refs, wanted, strict=True):
                entry = entries[ref.uid]
                assert (entry["device"], entry["profile"]) == (parent, "1g.10gb")
                assert entry["placement"] == placement
                spec = flow.read_cdi_spec(stack.config.cdi_root, claim_uid=ref.uid)
                assert spec is not None
                env = _env(spec)
                # The partition's MIG device, never the parent GPU's index.
                assert env["NVIDIA_VISIBLE_DEVICES"] == entry["id"]
                assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
                assert env["DRA_SUITE_PARTITION_PROFILE"] == "1g.10gb"
                assert env["DRA_SUITE_CLAIM_UID"] == ref.uid
                [device] = spec["devices"]
                nodes = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
                assert nodes[0] == f"/dev/nvidia{parent.removeprefix('gpu-')}"
                assert all(n.startswith("/dev/nvidia-caps/") for n in nodes[1:])

            unprepared = (await kubelet.unprepare(refs)).claims
            assert all(unprepared[r.uid].error == "" for r in refs)
            assert _sim_partitions(stack) == []
            for ref in refs:
                assert flow.read_cdi_spec(stack.config.cdi_root, claim_uid=ref.uid) is None
        finally:
            await kubelet.close()
