"""The DeviceConfig admission policy (deploy/kustomize/admission/deviceconfig.yaml), its CEL
evaluated with celpy on sample admission requests and checked case by case against the
allocation agent's own decoder; and both policies' bindings and rendering per overlay. The
generated corpus and the policy's generation: test_admission_deviceconfig_schema.py."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from services.allocation.claim import opaque
from shared.errors import InvalidOpaqueConfigError
from tests.unit.deploy.manifests import (
    ADMISSION,
    KUBECTL,
    KUSTOMIZE,
    OVERLAYS,
    SIM,
    _claim_spec,
    _docs,
    _example_objects,
    _overlay_classes,
    admission_policy,
    admission_request,
    evaluate_policy,
    policy_with_driver,
)

# --- DeviceConfig in claims, templates and classes ----------------------------------------


def _params(sharing: Any = None, **top: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": f"{SIM}/v1alpha1", "kind": "DeviceConfig", **top}
    if sharing is not None:
        doc["sharing"] = sharing
    return doc


TS, SP = "TimeSlicing", "SpacePartitioning"
CONFIG_CASES = [  # (parameters, allowed)
    (_params({"strategy": TS, "timeSlicing": {"interval": "Short"}}), True),
    (_params(), True),
    (_params({"strategy": "Exclusive"}), True),
    (_params({"strategy": TS}), True),
    (
        _params(
            {"strategy": SP, "spacePartitioning": {"computePercent": 50, "memoryLimit": "10Gi"}}
        ),
        True,
    ),
    (_params({"strategy": SP, "spacePartitioning": {"computePercent": 100}}), True),
    (_params({"strategy": TS}, apiVersion="gpu.dra-suite.io/v1alpha1"), False),
    (_params({"strategy": TS}, kind="GpuConfig"), False),
    (_params({"strategy": TS}, extra=True), False),
    (_params("TimeSlicing"), False),
    (_params({"strategy": "Fair"}), False),
    (_params({"strategy": TS, "timeSlicing": {"interval": "Forever"}}), False),
    (_params({"strategy": TS, "timeSlicing": {"interval": "Short", "slice": 3}}), False),
    (_params({"strategy": "Exclusive", "timeSlicing": {"interval": "Short"}}), False),
    (_params({"spacePartitioning": {"computePercent": 50}}), False),
    (_params({"strategy": SP, "spacePartitioning": {"computePercent": 0}}), False),
    (_params({"strategy": SP, "spacePartitioning": {"computePercent": 101}}), False),
    (_params({"strategy": SP, "spacePartitioning": {"computePercent": 50.5}}), False),
    (_params({"strategy": SP, "spacePartitioning": {"computePercent": True}}), False),
    (_params({"strategy": SP, "spacePartitioning": {"computePercent": "50"}}), False),
    (_params({"strategy": SP, "spacePartitioning": {"memoryLimit": "lots"}}), False),
    (_params({"strategy": SP, "spacePartitioning": {"memoryLimit": "0Gi"}}), False),
    (_params({"strategy": SP, "spacePartitioning": {"cores": 2}}), False),
]
CONFIG_IDS = [
    "time-slicing with the Short interval",
    "no sharing block",
    "exclusive",
    "time-slicing with the default interval",
    "space partitioning with percent and memory limit",
    "space partitioning with 100 percent",
    "another driver's apiVersion",
    "an unknown kind",
    "an unknown top-level field",
    "sharing that is no object",
    "an unknown strategy",
    "an unknown interval",
    "an unknown timeSlicing field",
    "a timeSlicing block with another strategy",
    "a spacePartitioning block without its strategy",
    "computePercent 0",
    "computePercent 101",
    "a fractional computePercent",
    "a boolean computePercent",
    "a string computePercent",
    "a memoryLimit that is no quantity",
    "a zero memoryLimit",
    "an unknown spacePartitioning field",
]


def _claim(parameters: dict[str, Any], *, driver: str = SIM) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": f"gpu.{SIM}"}}
    config = {"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [request], "config": [config]}},
    }


def _config_policy(driver: str = SIM) -> dict[str, Any]:
    return policy_with_driver(
        admission_policy("deviceconfig.yaml", "dra-suite-deviceconfig"), driver
    )


def _decodes(parameters: dict[str, Any]) -> bool:
    try:
        opaque.decode(parameters, driver=SIM)
    except InvalidOpaqueConfigError:
        return False
    return True


@pytest.mark.parametrize(("parameters", "allowed"), CONFIG_CASES, ids=CONFIG_IDS)
def test_config_policy_admits_a_claim_config_exactly_when_the_agent_decodes_it(parameters, allowed):
    request = admission_request(
        resource="resourceclaims", operation="CREATE", obj=_claim(parameters)
    )
    verdict = evaluate_policy(_config_policy(), request)
    assert verdict.allowed == allowed, verdict.denials
    assert _decodes(parameters) == allowed


@pytest.mark.parametrize(
    ("resource", "wrap"),
    [
        (
            "resourceclaimtemplates",
            lambda c: {"kind": "ResourceClaimTemplate", "spec": {"spec": c["spec"]}},
        ),
        (
            "deviceclasses",
            lambda c: {"kind": "DeviceClass", "spec": {"config": c["spec"]["devices"]["config"]}},
        ),
    ],
    ids=["in a claim template", "in a device class"],
)
@pytest.mark.parametrize("valid", [True, False], ids=["valid", "invalid"])
def test_config_policy_checks_templates_and_classes_too(resource, wrap, valid):
    parameters = CONFIG_CASES[0][0] if valid else _params({"strategy": "Fair"})
    request = admission_request(resource=resource, operation="CREATE", obj=wrap(_claim(parameters)))
    assert evaluate_policy(_config_policy(), request).allowed == valid


@pytest.mark.parametrize(
    "obj",
    [
        _claim(_params("whatever"), driver="nic.example.com"),
        {"kind": "ResourceClaim", "spec": {"devices": {"requests": []}}},
        {"kind": "ResourceClaim", "spec": {}},
    ],
    ids=["another driver's config", "a claim without config", "a claim without devices"],
)
def test_config_policy_leaves_other_claims_alone(obj):
    request = admission_request(resource="resourceclaims", operation="CREATE", obj=obj)
    assert evaluate_policy(_config_policy(), request).allowed


def test_config_policy_message_names_the_field_as_the_agent_does():
    request = admission_request(
        resource="resourceclaims", operation="CREATE", obj=_claim(_params(kind="Nope"))
    )
    (denial,) = evaluate_policy(_config_policy(), request).denials
    assert denial == "invalid opaque config: kind: must be 'DeviceConfig'"


def _shipped() -> list[tuple[str, str, dict[str, Any]]]:
    """(driver, resource, object) for every shipped class and example claim with a config."""
    found = []
    for overlay, (driver, _) in OVERLAYS.items():
        for device_class in _overlay_classes(overlay).values():
            found.append((driver, "deviceclasses", device_class))
    for doc in _example_objects():
        if _claim_spec(doc) is not None:
            resource = (
                "resourceclaims" if doc["kind"] == "ResourceClaim" else "resourceclaimtemplates"
            )
            found.append((SIM, resource, doc))
    return found


SHIPPED = _shipped()


@pytest.mark.parametrize(
    ("driver", "resource", "obj"),
    SHIPPED,
    ids=[f"{r}/{o['metadata']['name']}" for _, r, o in SHIPPED],
)
def test_config_policy_admits_every_shipped_class_and_example(driver, resource, obj):
    request = admission_request(resource=resource, operation="CREATE", obj=obj)
    assert evaluate_policy(_config_policy(driver), request).denials == ()


def test_config_policy_checks_claims_only_at_creation():
    rules = admission_policy("deviceconfig.yaml", "dra-suite-deviceconfig")["spec"][
        "matchConstraints"
    ]
    by_operation = {
        op: set(r["resources"]) for r in rules["resourceRules"] for op in r["operations"]
    }
    assert by_operation == {
        "CREATE": {"resourceclaims", "resourceclaimtemplates", "deviceclasses"},
        "UPDATE": {"deviceclasses"},
    }


# --- bindings and rendering ---------------------------------------------------------------


def test_every_policy_has_a_deny_binding():
    docs = [d for p in sorted(ADMISSION.glob("*.yaml")) for d in _docs(p)]
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert policies == {
        *("dra-suite-resourceslices-own-node", "dra-suite-devicetaintrules-own-node"),
        "dra-suite-deviceconfig",
        "dra-suite-resourceclaim-status-own-node",
    }
    assert {b["spec"]["policyName"] for b in bindings} == policies
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    for policy in docs:
        if policy["kind"] == "ValidatingAdmissionPolicy":
            assert policy["spec"]["failurePolicy"] == "Fail"


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_overlay_points_the_config_policy_at_its_driver(overlay):
    assert KUBECTL is not None
    rendered = subprocess.run(
        [KUBECTL, "kustomize", str(KUSTOMIZE / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    (policy,) = [
        d
        for d in yaml.safe_load_all(rendered)
        if d
        and d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"] == "dra-suite-deviceconfig"
    ]
    assert "namespace" not in policy["metadata"]
    driver = OVERLAYS[overlay][0]
    assert policy == policy_with_driver(policy, driver)
    ok = _claim({**CONFIG_CASES[0][0], "apiVersion": f"{driver}/v1alpha1"}, driver=driver)
    request = admission_request(resource="resourceclaims", operation="CREATE", obj=ok)
    assert evaluate_policy(policy, request).allowed
