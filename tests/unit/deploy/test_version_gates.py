"""Which Kubernetes version each new object needs, and what happens on the others.

The fields these objects use beyond 1.34 GA (DeviceClass `extendedResourceName`, request
`capacity` and `tolerations`) are all in the 1.34 and 1.35 API as alpha fields, so the strict
schemas of every version accept them; what differs is the feature gate. With its gate off (the
1.34/1.35 default) the API server drops such a field silently, so the objects that need one live
in a `k8s-1.36` component or folder. Checked here against the schemas and the API emulator
with each version's default gates."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from devcluster.apiserver import APIServerEmulator, ClusterConfig
from tests.unit.deploy.manifests import (
    COMPONENTS,
    KUBE_VERSIONS,
    KUBECTL,
    KUSTOMIZE,
    OVERLAYS,
    _docs,
    _example_objects,
    _overlay_classes,
)

VERSIONS = [v.rsplit(".", 1)[0] for v in KUBE_VERSIONS]
DEFAULT_GATES = [ClusterConfig(kubernetes_version=v) for v in VERSIONS]
GATED_FIELDS = [  # (schema definition, field, the gate that keeps it)
    ("DeviceClassSpec", "extendedResourceName", "DRAExtendedResource"),
    ("ExactDeviceRequest", "capacity", "DRAConsumableCapacity"),
    ("ExactDeviceRequest", "tolerations", "DRADeviceTaints"),
    ("ExactDeviceRequest", "adminAccess", "DRAAdminAccess"),
    ("DeviceRequest", "firstAvailable", "DRAPrioritizedList"),
]


@functools.cache
def _definitions(version: str) -> dict[str, Any]:
    root = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    path = root / f"v{version}-local-strict" / "_definitions.json"
    defs: dict[str, Any] = json.loads(path.read_text())["$defs"]
    return defs


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize(
    ("definition", "field", "gate"), GATED_FIELDS, ids=[f for _, f, _ in GATED_FIELDS]
)
def test_gated_field_is_in_the_schema_of_every_supported_version(definition, field, gate, version):
    properties = _definitions(version)[f"io.k8s.api.resource.v1.{definition}"]["properties"]
    assert field in properties


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_a_field_no_version_has_is_rejected_by_the_strict_schema(version):
    device_class = {**_overlay_classes("sim")["npu.sim.dra-suite.io"]}
    device_class["spec"] = {**device_class["spec"], "extendedResources": ["sim.dra-suite.io/npu"]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(device_class, version, strict=True)


# --- the k8s-1.36 components --------------------------------------------------------------


def _patched_classes(overlay: str) -> list[dict[str, Any]]:
    """The overlay's DeviceClasses with the component's patches merged (as kustomize does)."""
    classes = _overlay_classes(overlay)
    patched = []
    for patch in _docs(COMPONENTS[overlay] / "extended-resources.yaml"):
        base = classes[patch["metadata"]["name"]]
        patched.append({**base, "spec": {**base["spec"], **patch["spec"]}})
    return patched


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_component_gives_classes_extended_resource_names_of_their_driver(overlay):
    driver = OVERLAYS[overlay][0]
    patched = _patched_classes(overlay)
    assert patched
    names = [c["spec"]["extendedResourceName"] for c in patched]
    assert len(set(names)) == len(names), "one class per extended resource"
    assert all(n.startswith(f"{driver}/") for n in names), names


def _render_with_component(overlay: str, tmp_path: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    target = os.path.relpath(KUSTOMIZE / "overlays" / overlay, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [target], "components": [f"{target}/k8s-1.36"]})
    )
    result = subprocess.run(
        [KUBECTL, "kustomize", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_with_its_component_renders_valid_objects_for_every_version(overlay, tmp_path):
    rendered = _render_with_component(overlay, tmp_path)
    classes = {d["metadata"]["name"]: d for d in rendered if d["kind"] == "DeviceClass"}
    for patched in _patched_classes(overlay):
        assert classes[patched["metadata"]["name"]]["spec"] == patched["spec"]
    for version in KUBE_VERSIONS:
        for obj in rendered:
            kubernetes_validate.validate(obj, version, strict=True)
    if overlay == "nvidia":
        (discovery,) = [
            d
            for d in rendered
            if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "dra-discovery"
        ]
        env = {
            e["name"]: e.get("value")
            for e in discovery["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["MIG_PROFILES"].split(",")[0] == "1g.10gb"
        assert env["PUBLISH_PCI_BUS_ID"] == "true"


# --- what each version's API server keeps -------------------------------------------------


def _in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}


def _make_namespaces(kube: APIServerEmulator) -> None:
    """ "default" and the namespaces the examples bring, as in a cluster (the admin-access
    example's is labelled for it; the API server checks that label)."""
    kube.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    for namespace in (d for d in _example_objects() if d["kind"] == "Namespace"):
        kube.create_object(namespace)


def _requests(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["spec"] if obj["kind"] == "ResourceClaimTemplate" else obj["spec"]
    return list(spec["devices"]["requests"])


def _kept(obj: dict[str, Any], field: str) -> bool:
    for request in _requests(obj):
        if field in request or field in request.get("exactly", {}):
            return True
    return False


@pytest.mark.parametrize("kube", DEFAULT_GATES, indirect=True, ids=VERSIONS)
async def test_api_server_keeps_extended_resource_names_only_where_the_gate_is_on(
    kube: APIServerEmulator,
) -> None:
    on = kube.config.enabled("DRAExtendedResource")
    assert on == (kube.config.kubernetes_version == "1.36")
    for overlay in OVERLAYS:
        for device_class in _patched_classes(overlay):
            created = kube.create_object(device_class)
            assert ("extendedResourceName" in created["spec"]) == on, device_class["metadata"]


def _examples() -> list[dict[str, Any]]:
    return [
        d for d in _example_objects() if d["kind"] in ("ResourceClaim", "ResourceClaimTemplate")
    ]


@pytest.mark.parametrize("kube", DEFAULT_GATES, indirect=True, ids=VERSIONS)
async def test_api_server_accepts_every_example_claim_and_drops_fields_whose_gate_is_off(
    kube: APIServerEmulator,
) -> None:
    _make_namespaces(kube)
    for example in _examples():
        namespace = example["metadata"].get("namespace", "default")
        created = kube.create_object(_in_namespace(example, namespace))
        for definition, field, gate in GATED_FIELDS:
            if definition != "DeviceClassSpec" and _kept(example, field):
                assert _kept(created, field) == kube.config.enabled(gate), (
                    example["metadata"],
                    field,
                )


@pytest.mark.parametrize("kube", DEFAULT_GATES, indirect=True, ids=VERSIONS)
async def test_examples_for_older_versions_lose_nothing_that_changes_what_they_get(
    kube: APIServerEmulator,
) -> None:
    """Outside k8s-1.36/ a dropped field (tolerations on 1.34/1.35) is one that does not
    matter there: without the gate devices carry no taints."""
    root = [
        d
        for p in sorted((KUSTOMIZE / "examples").glob("*.yaml"))
        for d in _docs(p)
        if d["kind"] in ("ResourceClaim", "ResourceClaimTemplate")
    ]
    assert root
    _make_namespaces(kube)
    for example in root:
        namespace = example["metadata"].get("namespace", "default")
        created = kube.create_object(_in_namespace(example, namespace))
        dropped = {
            field
            for _, field, _ in GATED_FIELDS
            if _kept(example, field) and not _kept(created, field)
        }
        assert dropped <= {"tolerations"}, (example["metadata"]["name"], dropped)
        assert not dropped or not kube.config.enabled("DRADeviceTaints")
