"""One schema for claim configuration: the DeviceConfig admission policy is generated from the
schema the allocation agent decodes with, and on a generated corpus the *rendered* policy
(celpy, Kubernetes' quantity library over shared.quantity) and the agent's decoder accept and
refuse the same configs, naming the same field."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.allocation.claim import opaque
from shared.errors import InvalidOpaqueConfigError
from tests.unit.deploy.deviceconfig_corpus import edge_cases, object_paths, parameters
from tests.unit.deploy.manifests import (
    ADMISSION,
    KUBECTL,
    OVERLAYS,
    REPO,
    SIM,
    Verdict,
    _claim_spec,
    _example_objects,
    _overlay_classes,
    admission_policy,
    admission_request,
    compile_policy,
    evaluate_policy,
    policy_with_driver,
    render,
)

GENERATOR = REPO / "scripts" / "gen_admission_policy.py"
NAME = "dra-suite-deviceconfig"
_DENIAL = re.compile(r"invalid opaque config: (\S+): ")


def test_the_committed_policy_is_the_one_generated_from_the_schema(tmp_path: Path) -> None:
    out = tmp_path / "deviceconfig.yaml"
    subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out)], check=True, capture_output=True
    )
    committed = (ADMISSION / "deviceconfig.yaml").read_text(encoding="utf-8")
    assert out.read_text(encoding="utf-8") == committed, "run scripts/gen_admission_policy.py"


def _rendered_policy(overlay: str = "sim") -> dict[str, Any]:
    """The policy as the overlay installs it; the file with the overlay's driver without kubectl."""
    if KUBECTL is None:
        return policy_with_driver(admission_policy("deviceconfig.yaml", NAME), OVERLAYS[overlay][0])
    (policy,) = [
        d
        for d in render(f"overlays/{overlay}")
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == NAME
    ]
    return policy


@pytest.fixture(scope="module", autouse=True)
def _compiled() -> None:
    for overlay in OVERLAYS:
        compile_policy(_rendered_policy(overlay))


def _wrapped(resource: str, configs: list[dict[str, Any]]) -> dict[str, Any]:
    devices = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": f"gpu.{SIM}"}}]}
    if resource == "deviceclasses":
        return {"kind": "DeviceClass", "metadata": {"name": "c"}, "spec": {"config": configs}}
    spec = {"devices": {**devices, "config": configs}}
    if resource == "resourceclaimtemplates":
        return {"kind": "ResourceClaimTemplate", "metadata": {"name": "t"}, "spec": {"spec": spec}}
    return {"kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": spec}


def _policy_verdict(resource: str, documents: list[Any], driver: str = SIM) -> Verdict:
    configs = [{"opaque": {"driver": driver, "parameters": d}} for d in documents]
    request = admission_request(
        resource=resource, operation="CREATE", obj=_wrapped(resource, configs)
    )
    return evaluate_policy(_rendered_policy(), request)


def _agent_error(document: Any, driver: str = SIM) -> InvalidOpaqueConfigError | None:
    try:
        opaque.decode(document, driver=driver)
    except InvalidOpaqueConfigError as exc:
        return exc
    return None


def _denied_paths(verdict: Verdict) -> set[str]:
    paths = set()
    for denial in verdict.denials:
        found = _DENIAL.match(denial)
        assert found, f"a denial that is no rule's (a CEL error?): {denial}"
        paths.add(found[1])
    return paths


def _policy_paths(error: InvalidOpaqueConfigError) -> set[str]:
    """Where the policy may name the agent's error: for an unknown field, its object, which the
    field's path (keys may hold dots) only bounds."""
    if not str(error).endswith(": unknown field"):
        return {error.field}
    dots = [i for i, c in enumerate(error.field) if c == "."]
    return {"parameters"} | {error.field[:i] for i in dots}


def _assert_same_verdict(document: Any, resource: str = "resourceclaims") -> Verdict:
    verdict = _policy_verdict(resource, [document])
    error = _agent_error(document)
    denied = _denied_paths(verdict)
    if error is None:
        assert not denied, f"the agent accepts {document!r}, the policy denies: {verdict.denials}"
    else:
        assert _policy_paths(error) & denied, (
            f"the agent refuses {document!r} ({error}), the policy: {verdict.denials or 'admits'}"
        )
    return verdict


def _document(**sharing: Any) -> dict[str, Any]:
    return {"apiVersion": f"{SIM}/v1alpha1", "kind": "DeviceConfig", "sharing": sharing}


@pytest.mark.parametrize("focus", object_paths(), ids=lambda p: p or "document")
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_policy_and_agent_agree_on_the_generated_corpus(focus: str, data: st.DataObject) -> None:
    """Per object of the schema, configs that always have it: every field drawn often."""
    _assert_same_verdict(data.draw(parameters(SIM, focus), label="parameters"))


@pytest.mark.parametrize(
    "document",
    [
        _document(strategy="SpacePartitioning", spacePartitioning={"memoryLimit": "1e3"}),
        _document(strategy="SpacePartitioning", spacePartitioning={"computePercent": None}),
        {"apiVersion": f"{SIM}/v1alpha1", "kind": "DeviceConfig", "partition": {}},
        {"apiVersion": f"{SIM}/v1alpha1", "kind": "DeviceConfig", "partition": None},
        {"apiVersion": None, "kind": "DeviceConfig"},
        ["not", "an", "object"],
    ],
    ids=[
        "exponent",
        "null percent",
        "partition without profile",
        "null partition",
        "null apiVersion",
        "a list",
    ],
)
def test_policy_and_agent_agree_on_named_cases(document: Any) -> None:
    _assert_same_verdict(document)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    resource=st.sampled_from(["resourceclaims", "resourceclaimtemplates", "deviceclasses"]),
    documents=st.lists(parameters(SIM), min_size=1, max_size=3),
)
def test_a_request_is_admitted_exactly_when_the_agent_decodes_all_its_configs(
    resource: str, documents: list[Any]
) -> None:
    verdict = _policy_verdict(resource, documents)
    assert verdict.allowed == all(_agent_error(d) is None for d in documents), verdict.denials


EDGES = edge_cases(SIM)


@pytest.mark.parametrize("document", [d for _, d in EDGES], ids=[i for i, _ in EDGES])
def test_policy_and_agent_agree_on_every_field_at_its_edges(document: Any) -> None:
    """Each field at each bound and one past it, every quantity form, every wrong type."""
    _assert_same_verdict(document)


@pytest.mark.parametrize(
    ("memory_limit", "allowed"),
    [("1e3", True), ("1.5e3", True), ("8Ei", True), ("1E3", True), ("999m", False)],
)
def test_exponents_and_suffixes_are_quantities_to_both(memory_limit: str, allowed: bool) -> None:
    document = _document(
        strategy="SpacePartitioning", spacePartitioning={"memoryLimit": memory_limit}
    )
    assert _assert_same_verdict(document).allowed == allowed


@pytest.mark.parametrize(
    "partition",
    [{"profile": "1g.10gb"}, {"profile": "vir05_1c_8g"}, {"profile": "1g.10gb+me"}],
)
def test_partition_configs_are_admitted(partition: dict[str, str]) -> None:
    document = {"apiVersion": f"{SIM}/v1alpha1", "kind": "DeviceConfig", "partition": partition}
    assert _assert_same_verdict(document).allowed


def test_the_policy_names_the_driver_when_the_api_version_is_wrong() -> None:
    document = {"apiVersion": "gpu.dra-suite.io/v1alpha1", "kind": "DeviceConfig"}
    (denial,) = _assert_same_verdict(document).denials
    assert denial == f"invalid opaque config: apiVersion: must be {SIM}/v1alpha1"


def _shipped_configs() -> list[tuple[str, str, Any]]:
    """(where, driver, parameters) of every opaque config in the examples and the classes."""
    found = []
    for doc in _example_objects():
        spec = _claim_spec(doc)
        for config in (spec or {}).get("devices", {}).get("config", []):
            name = f"examples {doc['kind']}/{doc['metadata']['name']}"
            found.append((name, config["opaque"]["driver"], config["opaque"]["parameters"]))
    for overlay in OVERLAYS:
        for name, device_class in _overlay_classes(overlay).items():
            for config in device_class["spec"].get("config", []):
                found.append(
                    (
                        f"{overlay} DeviceClass/{name}",
                        config["opaque"]["driver"],
                        config["opaque"]["parameters"],
                    )
                )
    return found


SHIPPED = _shipped_configs()


def test_examples_carry_configs() -> None:
    assert any(where.startswith("examples") for where, _, _ in SHIPPED)


@pytest.mark.parametrize(("where", "driver", "document"), SHIPPED, ids=[w for w, _, _ in SHIPPED])
def test_every_shipped_config_passes_the_agent_and_the_policy(
    where: str, driver: str, document: Any
) -> None:
    assert _agent_error(document, driver) is None
    overlay = next(o for o, (d, _) in OVERLAYS.items() if d == driver)
    configs = [{"opaque": {"driver": driver, "parameters": document}}]
    request = admission_request(
        resource="resourceclaims", operation="CREATE", obj=_wrapped("resourceclaims", configs)
    )
    assert evaluate_policy(_rendered_policy(overlay), request).denials == ()
