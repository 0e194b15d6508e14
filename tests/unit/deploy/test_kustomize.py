"""Kustomize base, overlays and examples: files, Kubernetes schemas 1.34-1.36, DeviceClass CEL,
and each overlay as `kubectl kustomize` renders it (when kubectl is on PATH)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from kubernetes_validate import utils as kv_utils
from referencing import Registry, Resource

from devcluster.apiserver import APIServerEmulator

# --- kustomize files ----------------------------------------------------------------------
from tests.unit.deploy.manifests import (
    CEL_DOMAIN,
    CEL_DRIVER,
    KUBE_VERSIONS,
    KUBECTL,
    KUSTOMIZATIONS,
    KUSTOMIZE,
    MANIFESTS,
    OBJECTS,
    OVERLAYS,
    PATCHES,
    REPO,
    _assert_agent_accepts,
    _assert_env_names_are_flags,
    _assert_rbac_has_no_wildcard,
    _container,
    _docs,
    _env,
    _ids,
    _of_kind,
    _resolved_env,
    is_kubernetes,
    render,
)


@pytest.mark.parametrize("path", MANIFESTS + KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_yaml_file_parses(path: Path) -> None:
    assert _docs(path), "empty manifest"
    for doc in _docs(path):
        assert {"apiVersion", "kind"} <= doc.keys()


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=lambda p: str(p.parent.name))
def test_kustomization_lists_only_existing_files_and_every_file_beside_it(
    kustomization: Path,
) -> None:
    (spec,) = _docs(kustomization)
    listed = [
        *spec.get("resources", []),
        *(p["path"] for p in spec.get("patches", []) if "path" in p),  # not the inline ones
    ]
    for entry in listed:
        target = kustomization.parent / entry
        assert target.is_file() or (target / "kustomization.yaml").is_file(), entry
    beside = {p.name for p in kustomization.parent.glob("*.yaml")} - {"kustomization.yaml"}
    assert beside <= set(listed), f"not in kustomization.yaml: {sorted(beside - set(listed))}"


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize(("name", "doc"), OBJECTS, ids=_ids(OBJECTS))
def test_manifest_is_valid_against_the_kubernetes_schema(
    name: str, doc: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def _no_required_check(*_: Any) -> Iterator[jsonschema.ValidationError]:
    return iter(())


# A patch is a partial object: every field it names must exist, but none is required.
_PatchValidator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # stubs leave it bare
    jsonschema.Draft202012Validator, {"required": _no_required_check}
)


def _patch_errors(doc: dict[str, Any], version: str) -> list[str]:
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", doc["apiVersion"])
    schema = kv_utils.schema_contents(f"{folder}/{doc['kind'].lower()}-{group}.json", version)
    defs = kv_utils.schema_contents(f"{folder}/_definitions.json", version)
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    validator = _PatchValidator(schema, registry=registry)
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]


# cert-manager's patches are checked against its own schema (test_nats_cluster_component).
KUBERNETES_PATCHES = [(n, d) for n, d in PATCHES if is_kubernetes(d)]


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize(("name", "doc"), KUBERNETES_PATCHES, ids=_ids(KUBERNETES_PATCHES))
def test_patch_names_only_fields_of_the_kubernetes_schema(
    name: str, doc: dict[str, Any], version: str
) -> None:
    assert _patch_errors(doc, version) == []


# --- overlays and examples ----------------------------------------------------------------


def _folder_docs(folder: str) -> list[dict[str, Any]]:
    return [d for p in MANIFESTS if p.parent == KUSTOMIZE / folder for d in _docs(p)]


def _overlay_docs(overlay: str) -> list[dict[str, Any]]:
    return _folder_docs(f"overlays/{overlay}")


def _assert_device_classes_select_only(driver: str, docs: Any) -> None:
    classes = _of_kind(docs, "DeviceClass")
    assert classes, "an overlay installs its DeviceClasses"
    for device_class in classes:
        for selector in device_class["spec"]["selectors"]:
            expression = selector["cel"]["expression"]
            assert CEL_DRIVER.findall(expression) == [driver], expression
            assert set(CEL_DOMAIN.findall(expression)) <= {driver}, expression


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_device_classes_select_only_their_overlays_driver(overlay: str) -> None:
    _assert_device_classes_select_only(OVERLAYS[overlay][0], _overlay_docs(overlay))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_points_every_agent_at_its_driver_and_backend(overlay: str) -> None:
    driver, backend = OVERLAYS[overlay]
    patched = {
        _container(ds)["name"]: _env(ds) for ds in _of_kind(_overlay_docs(overlay), "DaemonSet")
    }
    assert sorted(patched) == ["allocation", "discovery", "health"]
    assert {agent: env["DRIVER_NAME"]["value"] for agent, env in patched.items()} == dict.fromkeys(
        patched, driver
    )
    assert patched["discovery"]["BACKEND"]["value"] == backend
    assert patched["allocation"]["BACKEND"]["value"] == backend
    assert patched["health"]["MONITOR"]["value"] == backend


def _example_docs() -> list[dict[str, Any]]:
    return _folder_docs("examples")


def _claim_specs(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for doc in docs:
        if doc["kind"] == "ResourceClaim":
            yield doc["spec"]
        elif doc["kind"] == "ResourceClaimTemplate":
            yield doc["spec"]["spec"]


# Classes the examples may name besides the sim overlay's: another driver's (the NIC of
# gpu-nic-same-pcie-root.yaml), which this repo does not ship.
FOREIGN_CLASSES = {"nic.example.com"}
STANDARD_ATTRIBUTES = "resource.kubernetes.io"


def test_examples_ask_for_sim_device_classes_and_sim_attributes() -> None:
    driver = OVERLAYS["sim"][0]
    classes = {d["metadata"]["name"] for d in _of_kind(_overlay_docs("sim"), "DeviceClass")}
    classes |= FOREIGN_CLASSES
    for spec in _claim_specs(_example_docs()):
        requests = {}  # "<request>" and "<request>/<subrequest>" -> the exact request
        for request in spec["devices"]["requests"]:
            requests[request["name"]] = request.get("exactly")
            for sub in request.get("firstAvailable", []):
                requests[f"{request['name']}/{sub['name']}"] = sub
        for exact in filter(None, requests.values()):
            assert exact["deviceClassName"] in classes
            for selector in exact.get("selectors", []):
                assert set(CEL_DOMAIN.findall(selector["cel"]["expression"])) == {driver}
        for constraint in spec["devices"].get("constraints", []):
            assert set(constraint["requests"]) <= requests.keys(), constraint
            assert constraint["matchAttribute"].split("/")[0] in {driver, STANDARD_ATTRIBUTES}


def test_example_pods_use_claims_the_examples_define() -> None:
    docs = _example_docs()
    claims = {d["metadata"]["name"] for d in _of_kind(docs, "ResourceClaim")}
    templates = {d["metadata"]["name"] for d in _of_kind(docs, "ResourceClaimTemplate")}
    for pod in _of_kind(docs, "Pod"):
        refs = {c["name"]: c for c in pod["spec"]["resourceClaims"]}
        for ref in refs.values():
            assert (
                ref.get("resourceClaimName") in claims
                or ref.get("resourceClaimTemplateName") in templates
            )
        for container in pod["spec"]["containers"]:
            assert {c["name"] for c in container["resources"]["claims"]} <= refs.keys()


@pytest.mark.parametrize("kube", ["1.34", "1.35", "1.36"], indirect=True)
async def test_api_emulator_accepts_device_classes_and_example_claims(
    kube: APIServerEmulator,
) -> None:
    # The namespaces first, as in a cluster: "default", and those the examples bring (the
    # admin-access example's is labelled for it; the API server checks that label).
    kube.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    for namespace in _of_kind(_example_docs(), "Namespace"):
        kube.create_object(namespace)
    objects = [d for overlay in OVERLAYS for d in _of_kind(_overlay_docs(overlay), "DeviceClass")]
    objects += [d for d in _example_docs() if d["apiVersion"].startswith("resource.k8s.io/")]
    for obj in objects:
        namespaced = obj["kind"] != "DeviceClass"
        namespace = {"namespace": obj["metadata"].get("namespace", "default")} if namespaced else {}
        kube.create_object({**obj, "metadata": {**obj["metadata"], **namespace}})


# --- rendered overlays (kubectl kustomize) ------------------------------------------------

needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: rendered overlays are not validated"
)
RENDER_TARGETS = [*(f"overlays/{o}" for o in OVERLAYS), "examples"]


@needs_kubectl
@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("target", RENDER_TARGETS)
def test_rendered_kustomization_is_valid_against_the_kubernetes_schema(
    target: str, version: str
) -> None:
    errors = []
    for obj in render(target):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(map(str, exc.path))
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {exc.message}")
    assert errors == []


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_overlay_wires_every_agent_to_its_driver(overlay: str) -> None:
    objects = render(f"overlays/{overlay}")
    daemonsets = _of_kind(objects, "DaemonSet")
    assert sorted(_container(ds)["name"] for ds in daemonsets) == [
        "allocation",
        "discovery",
        "health",
    ]
    for ds in daemonsets:
        _assert_env_names_are_flags(ds)
        _assert_agent_accepts(_container(ds)["name"], _resolved_env(ds))
        assert _env(ds)["DRIVER_NAME"]["value"] == OVERLAYS[overlay][0]
        defined: set[str] = set()
        for entry in _container(ds)["env"]:  # $(VAR) expands only variables defined before
            assert set(re.findall(r"\$\((\w+)\)", entry.get("value", ""))) <= defined, entry
            defined.add(entry["name"])
    _assert_rbac_has_no_wildcard(objects)
    _assert_device_classes_select_only(OVERLAYS[overlay][0], objects)
    namespaced = [o for o in objects if o["kind"] not in _CLUSTER_SCOPED]
    assert {o["metadata"].get("namespace") for o in namespaced} == {"dra-suite"}
    assert not [o for o in objects if o["kind"] in _CLUSTER_SCOPED and "namespace" in o["metadata"]]


_CLUSTER_SCOPED = {
    *("Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass"),
    *("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"),
}
