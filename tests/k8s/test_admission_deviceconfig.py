"""The DeviceConfig admission policy in a real kube-apiserver: applied with its binding as the
sim overlay renders them, it admits and denies a sample of the generated corpus
(tests/unit/deploy/deviceconfig_corpus.py) exactly as the allocation agent's decoder accepts
and refuses it, with one of the messages celpy gives for the same request. Requests are dry
runs (admission runs, nothing is stored); the policy is bound for a driver of this test's own,
so claims of other tests are never matched, and removed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from devcluster.controlplane.nodes import wait_for_service_account
from services.allocation.claim import opaque
from shared.errors import InvalidOpaqueConfigError, KubeInvalidError, KubeNotFoundError
from shared.kube.client import KubeClient
from shared.kube.resources import DEVICE_CLASSES, RESOURCE_CLAIMS, ResourceType
from tests.unit.deploy.deviceconfig_corpus import edge_cases, object_paths, parameters
from tests.unit.deploy.manifests import (
    KUSTOMIZE,
    _docs,
    admission_request,
    compile_policy,
    evaluate_policy,
    policy_with_driver,
)

pytestmark = pytest.mark.k8s

DRIVER = "admission-test.dra-suite.io"
NAME = "dra-suite-deviceconfig"
POLICIES = ResourceType(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies",
    "ValidatingAdmissionPolicy", namespaced=False,
)  # fmt: skip
BINDINGS = ResourceType(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
    "ValidatingAdmissionPolicyBinding", namespaced=False,
)  # fmt: skip
NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False)
TEMPLATES = ResourceType(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True
)
_names = itertools.count(1)


def _policy_and_binding() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = _docs(KUSTOMIZE / "admission" / "deviceconfig.yaml")
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    return policy_with_driver(policy, DRIVER), binding


def _sample(per_focus: int) -> list[Any]:
    """A fixed sample of the generated corpus: `per_focus` configs per object of the schema."""
    found: list[Any] = []
    for focus in object_paths():

        @settings(
            max_examples=per_focus,
            database=None,
            derandomize=True,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(parameters(DRIVER, focus))
        def collect(document: Any) -> None:
            found.append(document)

        collect()
    return found


def _claim(document: Any, namespace: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": f"gpu.{DRIVER}"}}
    config = {"opaque": {"driver": DRIVER, "parameters": document}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"c-{next(_names)}", "namespace": namespace},
        "spec": {"devices": {"requests": [request], "config": [config]}},
    }


async def _dry_run(admin: KubeClient, claim: dict[str, Any], namespace: str) -> str | None:
    """None when the API server admits `claim`; else the message it denies it with."""
    try:
        await admin._request(
            "POST",
            RESOURCE_CLAIMS.path(namespace=namespace),
            what="create resourceclaims (dry run)",
            query=[("dryRun", "All")],
            body=claim,
        )
    except KubeInvalidError as exc:
        return str(exc)
    return None


@pytest.fixture
async def namespace(admin: KubeClient) -> str:
    name = f"admission-{next(_names)}"
    await admin.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    await wait_for_service_account(admin, name)
    return name


@pytest.fixture
async def policy(admin: KubeClient, namespace: str) -> AsyncIterator[dict[str, Any]]:
    """The policy and its binding applied, and in force (a bad config is denied)."""
    policy, binding = _policy_and_binding()
    await admin.create(POLICIES, policy)
    await admin.create(BINDINGS, binding)
    try:
        bad = _claim({"apiVersion": f"{DRIVER}/v1alpha1", "kind": "Nope"}, namespace)
        deadline = time.monotonic() + 60
        while await _dry_run(admin, bad, namespace) is None:
            assert time.monotonic() < deadline, "the binding never took effect"
            await asyncio.sleep(0.5)
        yield policy
    finally:
        for kind in (BINDINGS, POLICIES):
            with contextlib.suppress(KubeNotFoundError):
                await admin._request("DELETE", kind.path(name=NAME), what=f"delete {kind.plural}")


def _agent_accepts(document: Any) -> bool:
    try:
        opaque.decode(document, driver=DRIVER)
    except InvalidOpaqueConfigError:
        return False
    return True


def _same_reason(document: Any, denial: str, celpy_denials: tuple[str, ...]) -> bool:
    """The server denies with one of celpy's messages; parameters that are no JSON object fail
    the API's own validation before admission."""
    if not isinstance(document, dict):
        return "must be a valid JSON object" in denial
    return any(d in denial for d in celpy_denials)


@pytest.mark.timeout(300)
async def test_the_real_api_server_admits_the_corpus_as_the_agent_and_celpy_do(
    admin: KubeClient, namespace: str, policy: dict[str, Any]
):
    compile_policy(policy)
    corpus = [d for _, d in edge_cases(DRIVER)] + _sample(per_focus=25)
    disagreements: list[tuple[Any, ...]] = []
    admitted = 0
    for document in corpus:
        claim = _claim(document, namespace)
        denial = await _dry_run(admin, claim, namespace)
        request = admission_request(resource="resourceclaims", operation="CREATE", obj=claim)
        celpy = evaluate_policy(policy, request)
        agent = _agent_accepts(document)
        if (denial is None) != agent or (denial is None) != celpy.allowed:
            disagreements.append((json.dumps(document), denial, agent, celpy.denials))
        elif denial is not None and not _same_reason(document, denial, celpy.denials):
            disagreements.append((json.dumps(document), denial, "celpy says", celpy.denials))
        admitted += denial is None
    assert not disagreements, "\n".join(map(str, disagreements))
    assert len(corpus) > 250
    assert 50 < admitted < len(corpus) - 50, "the sample has plenty of both verdicts"


async def test_partition_configs_apply_through_the_real_api_server(
    admin: KubeClient, namespace: str, policy: dict[str, Any]
):
    document = {
        "apiVersion": f"{DRIVER}/v1alpha1",
        "kind": "DeviceConfig",
        "partition": {"profile": "1g.10gb"},
        "sharing": {"strategy": "SpacePartitioning", "spacePartitioning": {"memoryLimit": "1e3"}},
    }
    made = await admin.create(RESOURCE_CLAIMS, _claim(document, namespace), namespace=namespace)
    assert made["spec"]["devices"]["config"][0]["opaque"]["parameters"] == document
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "partitioned"},
        "spec": {"spec": _claim(document, namespace)["spec"]},
    }
    await admin.create(TEMPLATES, template, namespace=namespace)
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"partitioned.{DRIVER}"},
        "spec": {"config": [{"opaque": {"driver": DRIVER, "parameters": document}}]},
    }
    await admin.create(DEVICE_CLASSES, device_class)
    bad = {**device_class, "metadata": {"name": f"bad.{DRIVER}"}}
    bad["spec"] = {"config": [{"opaque": {"driver": DRIVER, "parameters": {**document, "x": 1}}}]}
    with pytest.raises(KubeInvalidError, match="parameters: unknown field"):
        await admin.create(DEVICE_CLASSES, bad)
