"""The three agents as themselves on the real API server: the sim overlay's RBAC and admission
policies installed as rendered, each agent holding only its own ServiceAccount's token, bound
to a pod on its node as the kubelet mounts it.

- The whole node flow (slices published, a pod scheduled by kube-scheduler and prepared
  through the kubelet shim, the claim's device status written, a fault tainting the device
  with a DeviceTaintRule and Events, the fault cleared, the pod's claim unprepared) completes,
  and kube-apiserver's audit log shows every one of the agents' requests allowed, each by its
  own ClusterRole: the calls `tests/unit/deploy/test_rbac_least_privilege.py` measures against
  the emulator, now measured against the real authorizer and admission.
- The same tokens, used by an attacker holding node A, are refused another node's
  ResourceSlices, DeviceTaintRules and claim status, by RBAC or by the admission policies.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import itertools
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import structlog

from devcluster.controlplane import RealControlPlane, register_node
from devcluster.controlplane.kubeletshim import KubeletShim
from devcluster.controlplane.nodes import wait_for_service_account
from devcluster.flow import inject_fault
from services.health.agent import HealthAgent
from services.health.config import HealthConfig
from services.health.policy import Taint
from services.health.rule_objects import RuleSpec, rule_body, rule_name, rule_selector
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from shared.errors import KubeConflictError, KubeError, KubeNotFoundError
from shared.kube.client import KubeClient
from shared.kube.resources import (
    DEVICE_CLASSES,
    EVENTS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ResourceType,
    device_taint_rules,
)
from tests.k8s import audit
from tests.k8s.apply import Applier
from tests.k8s.nodestack import node_stack
from tests.k8s.nodestack import until as _until
from tests.k8s.tokens import SERVICE_ACCOUNTS, pod_bound_token
from tests.unit.deploy.manifests import KUBECTL, render
from tests.unit.deploy.test_rbac_least_privilege import RARE_GRANTS

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl renders the overlays"),
]

DRIVER = "sim.dra-suite.io"  # the sim overlay's: its policies and roles name it
NAMESPACE = "dra-suite"
CLASS = f"tokens.{DRIVER}"
ACCOUNTS = {"discovery": "dra-discovery", "allocation": "dra-allocation", "health": "dra-health"}
USERS = {agent: f"system:serviceaccount:{NAMESPACE}:{a}" for agent, a in ACCOUNTS.items()}
KINDS = {
    *("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"),
    *("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"),
}
POLICIES = {
    "discovery": "dra-suite-resourceslices-own-node",
    "health": "dra-suite-devicetaintrules-own-node",
    "allocation": "dra-suite-resourceclaim-status-own-node",
}
RULE_VERSION = {34: "v1alpha3", 35: "v1alpha3", 36: "v1beta2", 37: "v1"}
"""The DeviceTaintRule version each minor serves (with the release table's gates)."""
GRANULAR = ("resource.k8s.io", "resourceclaims/driver", "associated-node:update")
"""Asked of the authorizer inside a claim status write from 1.36, not a request of its own."""
NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False)
_runs = itertools.count(1)
_LOGGED_REFUSAL = re.compile(r": 403 |forbidden", re.IGNORECASE)
Obj = dict[str, Any]
Call = tuple[str, str, str]


@dataclasses.dataclass
class Installed:
    plane: RealControlPlane
    admin: KubeClient
    minor: int
    a: str
    """The node the agents run on (and the attacker's node)."""
    b: str
    """Another node: the policy probes come from it, and the attacker goes for its objects."""
    workload: str
    """The namespace of the claims and pods."""
    roles: dict[str, Obj]
    kube: dict[tuple[str, str], KubeSettings]
    """(agent, node) -> a kubeconfig with that agent's token bound to a pod on that node."""

    @property
    def rules(self) -> ResourceType:
        return device_taint_rules(RULE_VERSION[self.minor])


@pytest.fixture
async def installed(
    control_plane: RealControlPlane, admin: KubeClient, tmp_path: Path
) -> AsyncIterator[Installed]:
    """The overlay's RBAC and admission policies, two nodes, each agent's pod-bound token on
    both, once the API server enforces the policies (probed from node b)."""
    run = next(_runs)
    a, b, workload = f"tokens-a-{run}", f"tokens-b-{run}", f"tokens-{run}"
    docs = [d for d in render("overlays/sim") if d["kind"] in KINDS]
    applier = Applier(admin)
    minor = control_plane.release.minor_number
    for node in (a, b):
        await register_node(admin, node)
    await admin.create(NAMESPACES, {"metadata": {"name": workload}})
    await wait_for_service_account(admin, workload)
    try:
        for doc in sorted(docs, key=lambda d: d["kind"] != "Namespace"):
            await applier.create(doc)
        kube = {}
        for agent, account in ACCOUNTS.items():
            for node in (a, b):
                token = await pod_bound_token(
                    admin, namespace=NAMESPACE, account=account, node=node
                )
                path = tmp_path / f"{agent}-{node}.kubeconfig"
                kube[agent, node] = KubeSettings(
                    kubeconfig=str(control_plane.write_token_kubeconfig(path, token))
                )
        roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
        cluster = Installed(control_plane, admin, minor, a, b, workload, roles, kube)
        await _until_enforced(cluster)
        yield cluster
    finally:
        await applier.delete_all()
        for account in ACCOUNTS.values():
            for node in (a, b):
                with contextlib.suppress(KubeNotFoundError):
                    await admin.delete(
                        PODS, f"{account}-{node}", namespace=NAMESPACE, grace_period_s=0
                    )
        await _clean_up(admin, minor, (a, b))


async def _clean_up(admin: KubeClient, minor: int, nodes: tuple[str, ...]) -> None:
    """Slices and rules survive their agents on purpose (a restart keeps them)."""
    rules = device_taint_rules(RULE_VERSION[minor])
    for node in nodes:
        slices = await admin.list(RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")
        for item in slices["items"]:
            with contextlib.suppress(KubeNotFoundError):
                await admin.delete(RESOURCE_SLICES, item["metadata"]["name"])
        listed = await admin.list(rules, label_selector=rule_selector(driver=DRIVER, node=node))
        for item in listed["items"]:
            with contextlib.suppress(KubeNotFoundError):
                await admin.delete(rules, item["metadata"]["name"])


async def _until_enforced(c: Installed) -> None:
    """Until each policy refuses node b's agent a dry-run write for node a. A binding and a
    policy are enforced once the API server's informers have them (about a second); a refusal
    by RBAC (its binding not seen yet) does not count."""
    # The claim status probe changes nothing: kube-apiserver's own checks from 1.36 (of
    # status.devices per driver and node, of allocation and reservedFor) have nothing to refuse,
    # so only the policy (the claim is node a's) can.
    probe_claim = await _claim_allocated_to(c.admin, c.workload, f"probe-{c.b}", c.a)
    probes: dict[str, Callable[[KubeClient], Awaitable[Obj]]] = {
        "discovery": lambda k: _post(k, RESOURCE_SLICES, _slice(c.a, "probe"), dry_run=True),
        "health": lambda k: _post(k, c.rules, _rule(c, c.a, "gpu-0"), dry_run=True),
        "allocation": lambda k: _put(
            k,
            RESOURCE_CLAIMS,
            probe_claim,
            namespace=c.workload,
            subresource="status",
            dry_run=True,
        ),
    }
    clients = {agent: await KubeClient.connect(c.kube[agent, c.b]) for agent in ACCOUNTS}
    try:
        waiting, last = dict(probes), dict.fromkeys(probes, "went through")
        for _ in range(100):
            for agent, probe in list(waiting.items()):
                try:
                    await probe(clients[agent])
                except KubeError as exc:
                    last[agent] = str(exc)
                    if POLICIES[agent] in str(exc):
                        del waiting[agent]
            if not waiting:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"policies not enforced: { {a: last[a] for a in waiting} }")
    finally:
        for client in clients.values():
            await client.close()
        await c.admin.delete(RESOURCE_CLAIMS, probe_claim["metadata"]["name"], namespace=c.workload)


# -- the node flow ---------------------------------------------------------------------------


async def test_the_agents_run_a_node_on_their_own_tokens_and_are_never_refused(
    installed: Installed, nats_settings: NATSSettings, bus: Bus
):
    c, node, admin = installed, installed.a, installed.admin
    health = HealthAgent(HealthConfig(
        nats=nats_settings, kube=c.kube["health", node], node_name=node, driver_name=DRIVER,
        sim_profile="gpu", poll_interval_s=0.1, recovery_hold_s=0.0, flap_window_s=0.0,
        health_refresh_s=0.5,
    ))  # fmt: skip
    assert (health.config.taint_target, health.config.taint_effect) == ("rule", "NoSchedule")
    try:
        await admin.create(DEVICE_CLASSES, {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        })  # fmt: skip
        with structlog.testing.capture_logs() as logged:
            async with node_stack(
                admin, nats_settings, c.plane.kube_settings(), node=node, driver=DRIVER,
                tokens={agent: c.kube[agent, node] for agent in ("discovery", "allocation")},
                extra=[(health, lambda: health.ready.is_set() and health.bus.connected.is_set())],
                register=False, forget=False, prefix="dra-k8s-tokens-",
            ) as stack:  # fmt: skip
                await _flow(c, bus, stack.shim, health)
    finally:
        with contextlib.suppress(KubeNotFoundError):
            await admin.delete(DEVICE_CLASSES, CLASS)
    # The agents' own logs (captured in-process) say each write was made, and none refused.
    written = {"slice_created", "device_status_written", "claim_prepared", "claim_unprepared"}
    written |= {"taint_rule_created", "taint_rule_deleted", "event_written", "pod_event_written"}
    assert written <= {e.get("event") for e in logged}
    refusals = [e for e in logged if _LOGGED_REFUSAL.search(json.dumps(e, default=str))]
    assert refusals == [], refusals

    # Every request the agents made on node a, as kube-apiserver logged it: each allowed, by
    # the agent's own role, and every grant the emulator measures the agents using was used.
    granted = {a: _granted(c.roles[f"dra-suite-{a}"]) - {GRANULAR} for a in ACCOUNTS}
    expected = {(USERS[a], x) for a in ACCOUNTS for x in granted[a] - set(RARE_GRANTS[a])}
    made: dict[str, set[Call]] = {}
    paths: dict[str, set[str]] = {}
    logged_calls = await _audited(
        c.plane, node, want=lambda calls: expected <= {(x.user, x.call) for x in calls}
    )
    for call in logged_calls:
        agent = next(a for a, user in USERS.items() if user == call.user)
        assert call.decision == "allow", call
        assert call.code not in (401, 403, 422), call
        if call.resource:
            made.setdefault(agent, set()).add(call.call)
        else:  # API discovery and /version: every authenticated user's
            paths.setdefault(agent, set()).add(call.uri.partition("?")[0])
    problems = []
    for agent in ACCOUNTS:
        rare, calls = set(RARE_GRANTS[agent]), made.get(agent, set())
        problems += [f"{agent} made {x} without a grant" for x in sorted(calls - granted[agent])]
        problems += [f"{agent} never made {x}" for x in sorted(granted[agent] - calls - rare)]
    assert problems == [], "\n".join(problems)
    for agent in ACCOUNTS:  # for the record (-s)
        print(agent, sorted(made.get(agent, ())), sorted(paths.get(agent, ())))


async def _flow(c: Installed, bus: Bus, shim: KubeletShim, health: HealthAgent) -> None:
    admin, node, ns = c.admin, c.a, c.workload
    slices = await _until(lambda: _slices(admin, node))
    assert sum(len(s["spec"].get("devices", [])) for s in slices) == 4  # the `gpu` profile

    # A pod with a claim: kube-scheduler allocates a device of the node, the shim prepares it.
    await admin.create(RESOURCE_CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "one"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}},
    }, namespace=ns)  # fmt: skip
    await admin.create(PODS, _pod(node, "worker", "one"), namespace=ns)
    await _until(lambda: _running(admin, ns, "worker"))
    claim = await admin.get(RESOURCE_CLAIMS, "one", namespace=ns)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device = result["device"]
    assert (result["driver"], result["pool"]) == (DRIVER, node)
    assert shim.pods[f"{ns}/worker"].cdi_devices[claim["metadata"]["uid"]]

    # KEP-4817: the allocation agent writes its entry of the claim's status.devices.
    await _until(lambda: _conditions(admin, ns, "one", {"Ready": "True", "Healthy": "True"}))

    # A fault: a DeviceTaintRule for that device, Events on the Node and on the pod, the
    # claim's Healthy condition False; cleared, the rule goes and Healthy is True again.
    await inject_fault(bus, driver=DRIVER, node=node, device=device)
    rules = await _until(lambda: _rules(c, node))
    (rule,) = rules
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node, "device": device}
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert health.taints.version == RULE_VERSION[c.minor]
    await _until(lambda: _event(admin, "default", node, "DeviceUnhealthy"))
    await _until(lambda: _event(admin, ns, "worker", "DeviceUnhealthy"))
    await _until(lambda: _conditions(admin, ns, "one", {"Ready": "True", "Healthy": "False"}))
    await inject_fault(bus, driver=DRIVER, node=node, device=device, clear=True)
    await _until(lambda: _none(_rules(c, node)))
    await _until(lambda: _event(admin, "default", node, "DeviceRecovered"))
    await _until(lambda: _conditions(admin, ns, "one", {"Ready": "True", "Healthy": "True"}))

    # The pod goes: the shim unprepares, the agent removes its entries of the claim's status.
    await admin.delete(PODS, "worker", namespace=ns)
    await _until(lambda: _none(_pod_there(admin, ns, "worker")))
    assert [x.uid for x in shim.unprepared] == [claim["metadata"]["uid"]]
    await _until(lambda: _conditions(admin, ns, "one", {}))
    await admin.delete(RESOURCE_CLAIMS, "one", namespace=ns)


# -- the attacker on node a ------------------------------------------------------------------


async def test_node_a_tokens_are_refused_node_b_objects(installed: Installed):
    c, a, b, admin = installed, installed.a, installed.b, installed.admin
    # Node b's objects, as its own agents (and the scheduler) would have written them.
    their_slice = await admin.create(RESOURCE_SLICES, _slice(b, "gpus"))
    their_rule = await admin.create(c.rules, _rule(c, b, "gpu-0"))
    their_claim = await _claim_allocated_to(admin, c.workload, "theirs", b)
    clients = {agent: await KubeClient.connect(c.kube[agent, a]) for agent in ACCOUNTS}
    discovery, health, allocation = (clients[x] for x in ("discovery", "health", "allocation"))
    slice_policy, rule_policy = POLICIES["discovery"], POLICIES["health"]
    forged_slice = copy.deepcopy(their_slice)
    forged_slice["spec"]["devices"].append({"name": "gpu-1"})

    def hijack(rule: Obj) -> None:
        rule["spec"]["deviceSelector"]["pool"] = a
        rule["metadata"]["labels"]["dra-suite.io/node"] = a

    whole_pool = _rule(c, a, "gpu-0")
    del whole_pool["spec"]["deviceSelector"]["device"]
    our_claim = await _claim_allocated_to(admin, c.workload, "ours", a)
    reserved = copy.deepcopy(our_claim)
    reserved["status"]["reservedFor"] = [
        {"resource": "pods", "name": "p", "uid": "00000000-0000-0000-0000-000000000001"}
    ]
    forged_status = copy.deepcopy(their_claim)
    forged_status["status"]["devices"] = [_status_entry(b, "gpu-0")]
    # From 1.36 kube-apiserver's per-driver authorization refuses a status.devices change of a
    # claim allocated to another node itself (`arbitrary-node:update` is not granted); before,
    # the claim status policy does.
    claim_refusal = (
        'verb="[arbitrary-node:update]"' if c.minor >= 36 else f"(this claim is allocated to {b})"
    )
    # Reserving (or allocating) a claim is the scheduler's: from 1.36 kube-apiserver asks for
    # `resourceclaims/binding` itself; before, the policy refuses it.
    reserve_refusal = 'resource="resourceclaims/binding"' if c.minor >= 36 else "status.reservedFor"
    rbac = "cannot"  # RBAC's own words: `User "..." cannot <verb> resource "<resource>"`
    attacks: list[tuple[str, Callable[[], Awaitable[Any]], str]] = [
        ("discovery deletes b's slice",
         lambda: _delete(discovery, RESOURCE_SLICES, their_slice), slice_policy),
        ("discovery rewrites b's slice",
         lambda: _put(discovery, RESOURCE_SLICES, forged_slice), slice_policy),
        ("discovery creates a slice of b",
         lambda: _post(discovery, RESOURCE_SLICES, _slice(b, "more")), slice_policy),
        ("health taints b's device",
         lambda: _post(health, c.rules, _rule(c, b, "gpu-1")), rule_policy),
        ("health taints all of its pool",
         lambda: _post(health, c.rules, whole_pool), rule_policy),
        ("health rewrites b's rule into its own",
         lambda: _put_latest(health, admin, c.rules, their_rule, hijack), rule_policy),
        ("health deletes b's rule", lambda: _delete(health, c.rules, their_rule), rule_policy),
        ("health deletes b's slice", lambda: _delete(health, RESOURCE_SLICES, their_slice), rbac),
        ("allocation writes b's claim status",
         lambda: _put(allocation, RESOURCE_CLAIMS, forged_status, namespace=c.workload,
                      subresource="status"), claim_refusal),
        ("allocation reserves its own node's claim",
         lambda: _put(allocation, RESOURCE_CLAIMS, reserved, namespace=c.workload,
                      subresource="status"), reserve_refusal),
        ("allocation patches b's claim status",
         lambda: allocation.patch(RESOURCE_CLAIMS, "theirs", {"status": {"devices": []}},
                                  namespace=c.workload, subresource="status"), rbac),
        ("allocation deletes b's slice",
         lambda: _delete(allocation, RESOURCE_SLICES, their_slice), rbac),
        ("allocation deletes b's rule", lambda: _delete(allocation, c.rules, their_rule), rbac),
    ]  # fmt: skip
    unbound = await _unbound_token(c, "dra-health")
    try:
        problems = []
        for what, attack, expected in attacks:
            try:
                await attack()
            except KubeError as exc:
                if exc.status not in (403, 422) or expected not in str(exc):
                    problems.append(f"{what}: refused with {exc.status}, not for {expected!r}: "
                                    f"{exc}")  # fmt: skip
            else:
                problems.append(f"{what}: went through")
        # A token bound to no pod names no node: the policy refuses it even a rule of node a.
        try:
            await _post(unbound, c.rules, _rule(c, a, "gpu-2"))
            problems.append("health without a node went through")
        except KubeError as exc:
            if exc.status != 403 or "carries no node name" not in str(exc):
                problems.append(f"health without a node: {exc}")
        assert problems == [], "\n".join(problems)

        # Nothing of b's changed, nor node a's claim.
        slice_now = await admin.get(RESOURCE_SLICES, their_slice["metadata"]["name"])
        rule_now = await admin.get(c.rules, their_rule["metadata"]["name"])
        claim_now = await admin.get(RESOURCE_CLAIMS, "theirs", namespace=c.workload)
        for before, now in ((their_slice, slice_now), (their_rule, rule_now)):
            assert (now["metadata"].get("labels"), now["spec"]) == (
                before["metadata"].get("labels"),
                before["spec"],
            )
        assert claim_now["status"] == their_claim["status"]
        ours_now = await admin.get(RESOURCE_CLAIMS, "ours", namespace=c.workload)
        assert ours_now["status"] == our_claim["status"]
        assert not await _slices(admin, b, name=f"{b}-more")

        # kube-apiserver's audit log agrees: every request of node a's agents was refused, the
        # ones RBAC does not grant by the authorizer, the others after it (admission, or the
        # per-driver check of a claim's status).
        audited = await _audited(c.plane, a, want=lambda calls: len(calls) >= len(attacks))
        seen = sorted((x.user, x.verb, x.resource, x.code, x.decision) for x in audited)
        assert len(audited) == len(attacks), seen
        # kube-apiserver's own claim status checks (1.36+) answer 422 (a field error of type
        # Forbidden).
        status_code = 422 if c.minor >= 36 else 403
        status_write = (USERS["allocation"], "update", "resourceclaims/status")
        assert all(
            x.code == (status_code if (x.user, x.verb, x.resource) == status_write else 403)
            for x in audited
        ), seen
        forbidden_by_rbac = sorted((x.user, x.verb, x.resource) for x in audited
                                   if x.decision == "forbid")  # fmt: skip
        assert forbidden_by_rbac == sorted([
            (USERS["health"], "delete", "resourceslices"),
            (USERS["allocation"], "patch", "resourceclaims/status"),
            (USERS["allocation"], "delete", "resourceslices"),
            (USERS["allocation"], "delete", "devicetaintrules"),
        ])  # fmt: skip
    finally:
        for client in (*clients.values(), unbound):
            await client.close()
        for name in ("theirs", "ours"):
            await admin.delete(RESOURCE_CLAIMS, name, namespace=c.workload)


# -- helpers ---------------------------------------------------------------------------------


async def _audited(
    plane: RealControlPlane, node: str, *, want: Callable[[list[audit.AuditedCall]], bool]
) -> list[audit.AuditedCall]:
    """The agents' requests with tokens bound to `node` (dry-run probes left out), once `want`
    holds of them (an event may be written a moment after its response), or after 5 s."""
    calls: list[audit.AuditedCall] = []
    for _ in range(25):
        calls = [
            x
            for x in audit.read(plane.audit_log)
            if x.node == node and x.user in USERS.values() and not x.dry_run
        ]
        if want(calls):
            break
        await asyncio.sleep(0.2)
    return calls


def _granted(role: Obj) -> set[Call]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


async def _unbound_token(c: Installed, account: str) -> KubeClient:
    """A client with a token of `account` bound to nothing (so naming no node)."""
    path = SERVICE_ACCOUNTS.path(namespace=NAMESPACE, name=account, subresource="token")
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "spec": {"expirationSeconds": 600}}  # fmt: skip
    issued = await c.admin._request("POST", path, what="token request", body=request)
    kubeconfig = c.plane.workdir / f"unbound-{account}-{c.a}.kubeconfig"
    c.plane.write_token_kubeconfig(kubeconfig, str(issued["status"]["token"]))
    return await KubeClient.connect(KubeSettings(kubeconfig=str(kubeconfig)))


async def _post(
    client: KubeClient, rt: ResourceType, body: Obj, *, namespace: str | None = None,
    dry_run: bool = False,
) -> Obj:  # fmt: skip
    return await client._request(
        "POST", rt.path(namespace=namespace), what=f"create {rt.plural}",
        query=[("dryRun", "All")] if dry_run else None, body=body,
    )  # fmt: skip


async def _put(
    client: KubeClient, rt: ResourceType, body: Obj, *, namespace: str | None = None,
    subresource: str = "", dry_run: bool = False,
) -> Obj:  # fmt: skip
    name = body["metadata"]["name"]
    return await client._request(
        "PUT", rt.path(namespace=namespace, name=name, subresource=subresource),
        what=f"update {rt.plural}/{name}", query=[("dryRun", "All")] if dry_run else None,
        body=body,
    )  # fmt: skip


async def _put_latest(
    client: KubeClient, admin: KubeClient, rt: ResourceType, obj: Obj, change: Callable[[Obj], None]
) -> Obj:
    """PUT `obj` as it is now, changed: the device-taint eviction controller writes a rule's
    status, so a rule read a moment ago may be out of date (409, before admission)."""
    for _ in range(20):
        current = await admin.get(rt, obj["metadata"]["name"])
        change(current)
        with contextlib.suppress(KubeConflictError):
            return await _put(client, rt, current)
    raise AssertionError(f"{obj['metadata']['name']} kept changing")


async def _delete(client: KubeClient, rt: ResourceType, obj: Obj) -> None:
    await client.delete(rt, obj["metadata"]["name"])


def _slice(node: str, name: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{name}"},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}]},
    }  # fmt: skip


def _rule(c: Installed, node: str, device: str) -> Obj:
    """The rule node's health agent writes for a fault of `device`."""
    key = f"{DRIVER}/injected"
    spec = RuleSpec(
        name=rule_name(driver=DRIVER, node=node, device=device, key=key), driver=DRIVER,
        node=node, pool=node, device=device, taint=Taint(key=key, value="", effect="NoSchedule"),
    )  # fmt: skip
    return rule_body(spec, version=RULE_VERSION[c.minor])


def _status_entry(pool: str, device: str) -> Obj:
    condition = {"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    return {"driver": DRIVER, "pool": pool, "device": device, "conditions": [condition]}


async def _claim_allocated_to(admin: KubeClient, namespace: str, name: str, node: str) -> Obj:
    """A claim allocated, as the scheduler would, to gpu-0 of `node`."""
    claim = await admin.create(RESOURCE_CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}},
    }, namespace=namespace)  # fmt: skip
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    claim["status"] = {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node,
                                 "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [term]},
    }}  # fmt: skip
    return await admin.replace(RESOURCE_CLAIMS, claim, namespace=namespace, subresource="status")


def _pod(node: str, name: str, claim: str) -> Obj:
    only_this_node = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": only_this_node}},
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }  # fmt: skip


async def _slices(admin: KubeClient, node: str, *, name: str = "") -> list[Obj]:
    listed = await admin.list(RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")
    return [s for s in listed["items"] if not name or s["metadata"]["name"] == name]


async def _rules(c: Installed, node: str) -> list[Obj]:
    listed = await c.admin.list(c.rules, label_selector=rule_selector(driver=DRIVER, node=node))
    return list(listed["items"])


async def _running(admin: KubeClient, namespace: str, name: str) -> bool:
    pod = await admin.get(PODS, name, namespace=namespace)
    return (pod.get("status") or {}).get("phase") == "Running"


async def _pod_there(admin: KubeClient, namespace: str, name: str) -> list[Obj]:
    field = f"metadata.name={name}"
    return list((await admin.list(PODS, namespace=namespace, field_selector=field))["items"])


async def _event(admin: KubeClient, namespace: str, involved: str, reason: str) -> bool:
    field = f"involvedObject.name={involved}"
    events = await admin.list(EVENTS, namespace=namespace, field_selector=field)
    return any(e.get("reason") == reason for e in events["items"])


async def _conditions(admin: KubeClient, namespace: str, claim: str, want: dict[str, str]) -> bool:
    """The claim's status.devices entries of our driver have exactly these conditions (`{}`:
    there is no entry)."""
    found = await admin.get(RESOURCE_CLAIMS, claim, namespace=namespace)
    entries = [d for d in (found.get("status") or {}).get("devices", []) if d["driver"] == DRIVER]
    if not want:
        return not entries
    return (
        len(entries) == 1
        and {x["type"]: x["status"] for x in entries[0].get("conditions", [])} == want
    )


async def _none(check: Awaitable[list[Obj]]) -> bool:
    return not await check
