"""The claims a manifest stands for: claims, templates, a Pod's claims and its extended
resources (KEP-5004), and the manifests `dractl explain` refuses."""

from __future__ import annotations

from typing import Any

import pytest

from services.dractl.explain_manifest import ManifestError, read_manifest

Obj = dict[str, Any]
SPEC: Obj = {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "npu"}}]}}
TEMPLATE: Obj = {"kind": "ResourceClaimTemplate", "metadata": {"name": "t"}, "spec": {"spec": SPEC}}
NPU_CLASS: Obj = {
    "kind": "DeviceClass",
    "metadata": {"name": "npu"},
    "spec": {"extendedResourceName": "example.com/npu"},
}


def _pod(**spec: Any) -> Obj:
    return {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [], **spec}}


def test_a_template_stands_for_its_claim_in_the_namespace_given():
    manifest = read_manifest([TEMPLATE], namespace="ml")
    (claim,) = manifest.claims
    assert claim["metadata"] == {"name": "t", "namespace": "ml"}
    assert claim["spec"] == SPEC


def test_a_pods_template_claim_is_named_after_the_pod_and_entry():
    pod = _pod(resourceClaims=[{"name": "npu", "resourceClaimTemplateName": "t"}])
    manifest = read_manifest([TEMPLATE, pod], namespace="default")
    claims = manifest.pod_claims(templates={}, claims={}, classes=[])
    assert [c["metadata"]["name"] for c in claims] == ["p-npu"]


def test_a_pods_named_claim_comes_from_the_cluster():
    pod = _pod(resourceClaims=[{"name": "npu", "resourceClaimName": "shared"}])
    manifest = read_manifest([pod], namespace="default")
    assert manifest.wanted() == (set(), {("default", "shared")})
    existing = {"metadata": {"name": "shared", "namespace": "default"}, "spec": SPEC}
    claims = manifest.pod_claims(templates={}, claims={("default", "shared"): existing}, classes=[])
    assert claims == [existing]


def test_extended_resources_become_one_claim_with_a_request_per_container_resource():
    containers = [
        {"name": "a", "resources": {"limits": {"example.com/npu": "2", "cpu": "1"}}},
        {"name": "b", "resources": {"limits": {"deviceclass.resource.kubernetes.io/npu": 1}}},
    ]
    manifest = read_manifest([_pod(containers=containers)], namespace="default")
    (claim,) = manifest.pod_claims(templates={}, claims={}, classes=[NPU_CLASS])
    requests = claim["spec"]["devices"]["requests"]
    assert [(r["name"], r["exactly"]["count"]) for r in requests] == [
        ("container-0-request-1", 2),
        ("container-1-request-0", 1),
    ]


@pytest.mark.parametrize(
    ("documents", "error"),
    [
        (
            [{"kind": "ConfigMap", "metadata": {"name": "x"}}],
            r"no ResourceClaim, ResourceClaimTemplate or Pod to explain \(found ConfigMap/x\)",
        ),
        (["text"], "not a Kubernetes object"),
        ([NPU_CLASS], "no ResourceClaim, ResourceClaimTemplate or Pod"),
        ([{"kind": "ResourceClaim", "metadata": {}}], "without metadata.name"),
        (
            [{"kind": "ResourceClaimTemplate", "metadata": {"name": "t"}, "spec": {}}],
            "no spec.spec",
        ),
    ],
    ids=["other-kind", "not-an-object", "nothing-to-explain", "no-name", "template-without-spec"],
)
def test_manifests_dractl_cannot_explain_are_refused(documents, error):
    with pytest.raises(ManifestError, match=error):
        read_manifest(documents, namespace="default")


def test_a_missing_template_is_named():
    pod = _pod(resourceClaims=[{"name": "npu", "resourceClaimTemplateName": "gone"}])
    manifest = read_manifest([pod], namespace="default")
    with pytest.raises(ManifestError, match="ResourceClaimTemplate gone not found"):
        manifest.pod_claims(templates={}, claims={}, classes=[])
