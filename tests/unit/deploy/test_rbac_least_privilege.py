"""Least privilege, measured: each agent's ClusterRole (as the sim overlay renders it) against
the API calls the agent really makes. The three agents run as real processes (the local stack,
real nats-server) but each against an API emulator of its own, so each emulator's request log
is exactly one agent's calls, through a flow that makes them all: slices published, a claim
prepared and unprepared through the kubelet emulator, a fault raised and cleared. Every call
must be granted; every grant must have been used, or be listed below with the code path that
uses it only on rare occasions."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devcluster import flow
from devcluster.apiserver import APIServerEmulator
from devcluster.apiserver.config import ClusterConfig
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import AGENTS, LocalStack, StackConfig
from shared.bus.session import open_bus
from tests.unit.deploy.manifests import OBJECTS, PATCHES, SIM, _of_kind

pytestmark = pytest.mark.integration

NODE = "node-a"
DEVICE = "npu-0"
ROLES = {agent: f"dra-suite-{agent}" for agent in AGENTS}
Call = tuple[str, str, str]  # (API group, resource[/subresource], verb)
RARE_GRANTS: dict[str, dict[Call, str]] = {  # agent -> grant -> the code path that needs it
    "discovery": {
        ("resource.k8s.io", "resourceslices", "get"): (
            "reconciler.py _reread: a write that conflicted re-reads the slice"
        ),
        ("resource.k8s.io", "resourceslices", "update"): (
            "reconciler.py: a device, counter or taint that changed rewrites its slice"
        ),
        ("resource.k8s.io", "resourceslices", "delete"): (
            "reconciler.py: a pool that shrinks or splits deletes obsolete slices"
        ),
        ("", "events", "create"): "events.py: a rejected slice or a failing backend scan",
        ("", "events", "patch"): "events.py: a repeated Event is counted up with a patch",
    },
    "allocation": {},
    "health": {
        ("resource.k8s.io", "devicetaintrules", "get"): (
            "taints.py _apply: a rule that already exists (an earlier run's) is read back"
        ),
        ("resource.k8s.io", "devicetaintrules", "update"): (
            "taints.py _apply: a rule whose taint changed (another cause, a drain) is rewritten"
        ),
    },
}
"""Grants this flow does not (always) exercise: a retried create that finds the rule there reads
it back, a slice whose content changed is rewritten. Each must still be granted."""


def _granted(role: dict[str, Any]) -> set[Call]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _group(path: str) -> str:
    match = re.match(r"^/apis/([^/]+)/", path)
    return match[1] if match else ""


def _calls(emulator: APIServerEmulator) -> set[Call]:
    """What the agent asked the API server for; discovery of the API itself (/api, /apis,
    /version) is every authenticated user's and needs no role. A write of a claim's status
    also asks the authorizer what kube-apiserver 1.36+ asks for a change of `status.devices`
    (DRAResourceClaimGranularStatusAuthorization, pkg/registry/resource/utils.go
    AuthorizedForDeviceStatus): the synthetic `resourceclaims/driver`, with the verb prefixed
    `associated-node:` for a service account bound to the claim's node (the agent's case)."""
    calls = {
        (_group(r.path), f"{r.resource}/{r.subresource}".rstrip("/"), r.verb)
        for r in emulator.request_log.records()
        if r.resource
    }
    return calls | {
        (group, "resourceclaims/driver", f"associated-node:{verb}")
        for group, resource, verb in calls
        if resource == "resourceclaims/status" and verb in ("update", "patch")
    }


async def _until(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)
    return found


def _node() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
    }


def _allocated_claim(allocation: APIServerEmulator) -> dict[str, Any]:
    """A claim the scheduler allocated one device of this node to, in the agent's emulator."""
    claim = allocation.create_object(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "rbac-probe", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "npu", "exactly": {"deviceClassName": "npu.sim.dra-suite.io"}}
                    ]
                }
            },
        }
    )
    result = {"request": "npu", "driver": SIM, "pool": NODE, "device": DEVICE}
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    claim["status"] = {
        "allocation": {
            "devices": {"results": [result]},
            "nodeSelector": {"nodeSelectorTerms": [term]},
        }
    }
    return allocation.update_object(claim, status=True)


async def _exercise(stack: LocalStack, emulators: dict[str, APIServerEmulator]) -> None:
    discovery, allocation, health = (emulators[a] for a in AGENTS)
    await _until(lambda: discovery.objects("resourceslices"), "the node's ResourceSlices")
    claim = _allocated_claim(allocation)
    kubelet = KubeletEmulator(stack.config.registry_dir)
    try:
        await kubelet.register(driver=SIM)
        ref = flow.kubelet_claim(claim)
        prepared = (await kubelet.prepare([ref])).claims[ref.uid]
        assert not prepared.error, prepared.error
        unprepared = (await kubelet.unprepare([ref])).claims[ref.uid]
        assert not unprepared.error, unprepared.error
    finally:
        await kubelet.close()
    async with open_bus(stack.nats_settings) as bus:
        await flow.inject_fault(bus, driver=SIM, node=NODE, device=DEVICE)
        await _until(lambda: health.objects("devicetaintrules"), "the fault's DeviceTaintRule")
        await _until(lambda: health.objects("events", "default"), "the Node's Event")
        await flow.inject_fault(bus, driver=SIM, node=NODE, device=DEVICE, clear=True)
        await _until(lambda: not health.objects("devicetaintrules"), "the rule's removal")


@pytest.fixture
def stack_dir(short_tmp: Path) -> Path:
    return short_tmp / "stack"


def test_no_overlay_or_component_patches_a_role():
    assert not [name for name, d in PATCHES if d["kind"] in ("ClusterRole", "Role")]


async def test_each_role_grants_exactly_the_calls_its_agent_makes(stack_dir, tmp_path):
    emulators = {agent: APIServerEmulator(ClusterConfig.for_tests("1.36")) for agent in AGENTS}
    for emulator in emulators.values():
        await emulator.start()
    try:
        kubeconfigs = {}
        for agent, emulator in emulators.items():
            emulator.create_object(_node())
            kubeconfigs[agent] = emulator.write_kubeconfig(tmp_path / f"{agent}.kubeconfig")
        config = StackConfig(
            workdir=stack_dir,
            node_name=NODE,
            recovery_hold_s=0.2,
            extra_args=tuple((a, ("--kubeconfig", str(k))) for a, k in kubeconfigs.items()),
        )
        stack = LocalStack(config)
        await stack.start()
        try:
            await _exercise(stack, emulators)
        finally:
            codes = await stack.stop()
        assert codes == dict.fromkeys(AGENTS, 0)
        calls = {agent: _calls(emulator) for agent, emulator in emulators.items()}
    finally:
        for emulator in emulators.values():
            await emulator.stop()
    # The base's roles: no overlay or Component patches them (so no kubectl needed here).
    roles = {r["metadata"]["name"]: r for r in _of_kind([d for _, d in OBJECTS], "ClusterRole")}
    problems = []
    for agent, role in ROLES.items():
        granted, made, rare = _granted(roles[role]), calls[agent], set(RARE_GRANTS[agent])
        problems += [f"{agent} calls without a grant: {c}" for c in sorted(made - granted)]
        problems += [f"{agent} never uses {c}" for c in sorted(granted - made - rare)]
        problems += [f"{agent}: {c} is not granted" for c in sorted(rare - granted)]
    assert problems == [], "\n".join(problems)
