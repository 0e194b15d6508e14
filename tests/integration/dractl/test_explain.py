"""`dractl explain` against a live API emulator: slices the discovery agent builds from the sim
profile, the sim overlay's DeviceClasses, other claims' allocations and DeviceTaintRules; by
claim name and from manifests (claim, template, Pod), with the exit codes of the command."""

from __future__ import annotations

import asyncio
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.apiserver import APIServerEmulator
from services.dractl import cli
from services.dractl.commands import explain
from shared.config import KubeSettings
from shared.kube import resources
from shared.kube.client import KubeClient
from tests.unit.allocator.sim_cluster import DRIVER, node_slices, sim_classes

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
NPU = "npu.sim.dra-suite.io"
REPO = str(Path(__file__).resolve().parents[3])
NUMA = f'device.attributes["{DRIVER}"].numaNode == 1'


def _claim(name: str, *, count: int = 2, cel: str = NUMA, cls: str = NPU, **extra: Any) -> Obj:
    exactly: Obj = {"deviceClassName": cls, "count": count, **extra}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "npus", "exactly": exactly}]}},
    }


@pytest.fixture
async def client(kube_settings: KubeSettings, kube: APIServerEmulator) -> Any:
    kube_client = await KubeClient.connect(kube_settings)
    for device_class in sim_classes():
        await kube_client.create(resources.DEVICE_CLASSES, device_class)
    for node in ("node-a", "node-b"):
        for item in await node_slices(node):
            await kube_client.create(resources.RESOURCE_SLICES, item)
    yield kube_client
    await kube_client.close()


async def _explain(kube_settings: KubeSettings, *argv: str) -> tuple[int, str]:
    args = cli._parser().parse_args(["explain", *argv, "--kubeconfig", kube_settings.kubeconfig])
    out = io.StringIO()
    code = await explain.run(args, out=out)
    return code, out.getvalue()


async def _allocate(client: KubeClient, claim: Obj, *, node: str, devices: list[str]) -> None:
    created = await client.create(resources.RESOURCE_CLAIMS, claim, namespace="default")
    results = [{"request": "npus", "driver": DRIVER, "pool": node, "device": d} for d in devices]
    created["status"] = {"allocation": {"devices": {"results": results}}}
    await client.replace(
        resources.RESOURCE_CLAIMS, created, namespace="default", subresource="status"
    )


async def test_a_claim_that_fits_shows_the_allocation_on_every_node(client, kube_settings):
    await client.create(resources.RESOURCE_CLAIMS, _claim("pair"), namespace="default")
    code, out = await _explain(kube_settings, "pair", "-o", "json")
    assert code == 0
    answer = json.loads(out)
    assert answer["fits"] is True
    assert [(n["node"], n["fits"]) for n in answer["nodes"]] == [("node-a", True), ("node-b", True)]
    assert [r["device"] for r in answer["nodes"][0]["allocation"]] == ["npu-4", "npu-5"]


async def test_devices_held_by_another_claim_are_named_and_the_authors_change_comes_first(
    client, kube_settings
):
    for node in ("node-a", "node-b"):
        holder = _claim(f"holder-{node}", count=3, cel="")
        await _allocate(client, holder, node=node, devices=["npu-4", "npu-5", "npu-6"])
    await client.create(resources.RESOURCE_CLAIMS, _claim("pair"), namespace="default")
    code, out = await _explain(kube_settings, "pair", "-o", "json")
    assert code == 1
    answer = json.loads(out)
    node_a = answer["nodes"][0]
    verdicts = {d["device"].rsplit("/", 1)[1]: d for d in node_a["requests"][0]["devices"]}
    assert verdicts["npu-4"]["message"] == "allocated to claim default/holder-node-a"
    assert verdicts["npu-0"]["rule"] == "claim-selector"
    assert verdicts["gpu-0"]["rule"] == "class-selector"
    assert verdicts["npu-7"]["rule"] == "candidate"
    assert answer["closest"] == {
        "node": "node-a",
        # Fewer devices fit now; freeing the holder's would mean evicting someone else's pods.
        "change": "lower the count of request npus from 2 to 1",
    }


async def test_the_table_lists_the_devices_of_the_class_and_wide_lists_the_rest(
    client, kube_settings
):
    for node in ("node-a", "node-b"):
        holder = _claim(f"holder-{node}", count=3, cel="")
        await _allocate(client, holder, node=node, devices=["npu-4", "npu-5", "npu-6"])
    await client.create(resources.RESOURCE_CLAIMS, _claim("pair"), namespace="default")
    code, table = await _explain(kube_settings, "pair", "--node", "node-a")
    assert code == 1
    assert "npu-4  allocated to claim default/holder-node-a" in table
    assert "/gpu-0" not in table
    assert re.search(r"\(\+\d+ devices? outside the class; -o wide lists them\)", table)
    code, wide = await _explain(kube_settings, "pair", "--node", "node-a", "-o", "wide")
    assert code == 1
    assert "/gpu-0" in wide
    assert "outside the class" not in wide


async def test_a_device_taint_rule_blocks_untolerating_requests(client, kube_settings):
    version = "v1beta2"  # what the 1.36 emulator serves DeviceTaintRules in
    for node in ("node-a", "node-b"):
        rule = {
            "apiVersion": f"resource.k8s.io/{version}",
            "kind": "DeviceTaintRule",
            "metadata": {"name": f"ring1-{node}"},
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": node},
                "taint": {"key": f"{DRIVER}/maintenance", "effect": "NoSchedule"},
            },
        }
        await client.create(resources.device_taint_rules(version), rule)
    await client.create(resources.RESOURCE_CLAIMS, _claim("pair"), namespace="default")
    code, out = await _explain(kube_settings, "pair", "--node", "node-b")
    assert code == 1
    assert f"tainted {DRIVER}/maintenance:NoSchedule without toleration (DeviceTaintRule" in out
    assert "closest node: node-b; change: add to request npus the toleration" in out


async def test_from_files_a_template_and_a_pod_are_explained(client, kube_settings, tmp_path):
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-npu"},
        "spec": {"spec": _claim("x", count=1, cel="")["spec"]},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "resourceClaims": [{"name": "npu", "resourceClaimTemplateName": "one-npu"}],
        },
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump_all([template, pod]))
    code, out = await _explain(kube_settings, "-f", str(path), "--node", "node-a", "-o", "yaml")
    assert code == 0
    answers = yaml.safe_load(out)
    assert [a["claim"] for a in answers] == ["default/one-npu", "default/trainer-npu"]
    assert all(a["nodes"][0]["allocation"][0]["device"] == "npu-0" for a in answers)


@pytest.mark.parametrize(
    ("claim", "error"),
    [
        (_claim("c", cls="missing.example.com"), "device class missing.example.com not found"),
        (_claim("c", cel="device.attributes["), "CEL compile error"),
        (_claim("c", cls="nic.example.com", cel=""), "asks only for devices of other drivers"),
    ],
    ids=["unknown-class", "malformed-cel", "other-driver-only"],
)
async def test_bad_input_exits_2_with_a_clear_error(client, kube_settings, tmp_path, claim, error):
    nic = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "nic.example.com"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "nic.example.com"'}}]},
    }
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump_all([nic, claim]))
    code, stderr = await _dractl(kube_settings, "explain", "-f", str(path), "--driver-name", DRIVER)
    assert code == 2
    assert error in stderr


async def test_the_command_exits_0_when_it_fits_and_1_when_not(client, kube_settings, tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(_claim("nine", count=9, cel="")))
    code, _ = await _dractl(kube_settings, "explain", "-f", str(path))
    assert code == 1
    path.write_text(yaml.safe_dump(_claim("two", count=2)))
    code, _ = await _dractl(kube_settings, "explain", "-f", str(path), "--all-nodes")
    assert code == 0


async def _dractl(kube_settings: KubeSettings, *argv: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.dractl",
        *argv,
        "--kubeconfig",
        kube_settings.kubeconfig,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_a_pods_claims_must_fit_together(client, kube_settings, tmp_path):
    templates = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"five-{i}"},
            "spec": {"spec": _claim("x", count=5, cel="")["spec"]},
        }
        for i in (0, 1)
    ]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "greedy"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "resourceClaims": [
                {"name": "a", "resourceClaimTemplateName": "five-0"},
                {"name": "b", "resourceClaimTemplateName": "five-1"},
            ],
        },
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump_all([pod, *templates]))
    code, out = await _explain(kube_settings, "-f", str(path), "--node", "node-a")
    assert code == 1
    assert "CLAIM default/greedy-a: fits on 1 of 1 node" in out
    assert "CLAIM default/greedy-b: fits on 1 of 1 node" in out
    assert "POD default/greedy: its 2 claims fit together on 0 of 1 nodes" in out


async def test_the_shipped_admin_access_example_is_explained_and_its_other_kinds_skipped(
    client, kube_settings
):
    example = Path(REPO) / "deploy/kustomize/examples/npu-admin-access.yaml"
    code, stderr = await _dractl(kube_settings, "explain", "-f", str(example))
    assert code == 0, stderr
    # Its Namespace counts (its label allows the admin access), its DaemonSet is skipped.
    assert "skipped DaemonSet/npu-monitor (not a claim, template or pod)" in stderr


def _admin_claim(namespace: str) -> Obj:
    claim = _claim("inspect", count=1, cel="", adminAccess=True)
    claim["metadata"]["namespace"] = namespace
    return claim


async def test_admin_access_in_an_unlabelled_namespace_is_bad_input(
    client, kube_settings, tmp_path
):
    """The API server would refuse the claim (KEP-5018): it cannot fit, it cannot even exist."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    await client.create(explain.NAMESPACES, namespace)
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(_admin_claim("team-a")))
    code, stderr = await _dractl(kube_settings, "explain", "-f", str(path))
    assert code == 2
    assert (
        "claim team-a/inspect: the API server rejects it: spec.devices.requests[0].adminAccess: "
        "Forbidden: admin access to devices requires the "
        "`resource.kubernetes.io/admin-access: true` label on the containing namespace"
    ) in stderr
    path.write_text(yaml.safe_dump(_admin_claim("nowhere")))
    code, stderr = await _dractl(kube_settings, "explain", "-f", str(path))
    assert code == 2
    assert 'could not retrieve namespace to verify admin access: namespaces "nowhere"' in stderr


async def test_admin_access_in_a_labelled_namespace_is_explained(client, kube_settings, tmp_path):
    labels = {"resource.kubernetes.io/admin-access": "true"}
    metadata = {"name": "ops", "labels": labels}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}
    await client.create(explain.NAMESPACES, namespace)
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(_admin_claim("ops")))
    code, stderr = await _dractl(kube_settings, "explain", "-f", str(path))
    assert code == 0, stderr


async def test_a_node_without_devices_says_so_and_exits_1(client, kube_settings, tmp_path):
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(_claim("two", count=2)))
    code, stderr = await _dractl(kube_settings, "explain", "-f", str(path), "--node", "nope")
    assert code == 1
    assert "no such node: nope (nodes with devices: node-a, node-b)" in stderr
    assert "candidates" not in stderr
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only"}}
    await client.create(resources.NODES, node)
    code, stderr = await _dractl(kube_settings, "explain", "-f", str(path), "--node", "cpu-only")
    assert code == 1
    assert "node cpu-only has no devices: no ResourceSlice names it" in stderr


async def test_an_allocated_claim_shows_its_drivers_device_conditions(client, kube_settings):
    claim = _claim("prepared")
    await _allocate(client, claim, node="node-a", devices=["npu-4", "npu-5"])
    stored = await client.get(resources.RESOURCE_CLAIMS, "prepared", namespace="default")
    at = "2026-11-26T00:00:00Z"
    ready = {"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
             "lastTransitionTime": at}  # fmt: skip
    sick = {"type": "Healthy", "status": "False", "reason": "XID79",
            "message": "fell off the bus", "lastTransitionTime": at}  # fmt: skip
    stored["status"]["devices"] = [
        {"driver": DRIVER, "pool": "node-a", "device": "npu-4", "conditions": [ready, sick]},
        {"driver": DRIVER, "pool": "node-a", "device": "npu-5", "conditions": [ready]},
    ]
    await client.replace(
        resources.RESOURCE_CLAIMS, stored, namespace="default", subresource="status"
    )
    code, out = await _explain(kube_settings, "prepared", "-o", "json")
    assert code == 0
    answer = json.loads(out)
    assert [d["device"] for d in answer["devices"]] == ["npu-4", "npu-5"]
    assert answer["devices"][0]["conditions"][1]["reason"] == "XID79"
    code, out = await _explain(kube_settings, "prepared")
    assert (
        f"DEVICE {DRIVER}/node-a/npu-4: Ready=True, Healthy=False (XID79: fell off the bus)" in out
    )
    assert f"DEVICE {DRIVER}/node-a/npu-5: Ready=True" in out


async def test_a_claim_without_device_status_shows_no_device_lines(client, kube_settings):
    await client.create(resources.RESOURCE_CLAIMS, _claim("pending"), namespace="default")
    _, out = await _explain(kube_settings, "pending", "-o", "json")
    assert "devices" not in json.loads(out)
    _, out = await _explain(kube_settings, "pending")
    assert "DEVICE " not in out
