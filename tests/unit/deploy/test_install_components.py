"""The install options of NVIDIA's DRA driver chart, as kustomize components: driver root and
arm64 library paths, the kubelet root of MicroK8s and k0s, the image and its pull secret,
node selection by Node Feature Discovery, OpenShift's SCCs, Prometheus Operator PodMonitors,
priority classes. Each is rendered as a user's kustomization would, and the result checked
against the Kubernetes schemas (or the CRD's) and against what the agents parse."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.unit.deploy.manifests import (
    CONFIG_BUILDERS,
    KUBE_VERSIONS,
    KUBECTL,
    KUSTOMIZE,
    OVERLAYS,
    REPO,
    _assert_rbac_has_no_wildcard,
    _container,
    _of_kind,
    _resolved_env,
    is_kubernetes,
    local_env,
    render,
)
from tests.unit.deploy.pod_security import least_level, pod_templates

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="needs kubectl (kustomize)")

IMAGE = "ghcr.io/dra-suite/dra-suite"
Objects = tuple[dict[str, Any], ...]


@functools.cache
def _render(target: str, *components: str, extra: str = "", namespace: str = "") -> Objects:
    """A user's kustomization: `target` and `components` (folders under deploy/kustomize), plus
    `extra` kustomization YAML (images: ...), in another `namespace` as docs/install.md says."""
    assert KUBECTL is not None
    with tempfile.TemporaryDirectory() as tmp:
        kustomization = {
            "resources": [os.path.relpath(KUSTOMIZE / target, tmp)],
            "components": [os.path.relpath(KUSTOMIZE / c, tmp) for c in components],
            **(yaml.safe_load(extra) or {}),
        }
        if namespace:
            kustomization["namespace"] = namespace
            kustomization["transformers"] = [os.path.relpath(KUSTOMIZE / "namespace", tmp)]
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        result = subprocess.run(
            [KUBECTL, "kustomize", tmp], capture_output=True, text=True, timeout=60, check=False
        )
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def _one(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _assert_valid(objects: Objects, *kinds: str) -> None:
    for obj in objects:
        if obj["kind"] in kinds:
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)


def _allocation(objects: Objects) -> dict[str, Any]:
    return _one(objects, "DaemonSet", "dra-allocation")


# --- driver root and arm64 (nvidia) ---------------------------------------------------------


def _nvml_host_file(objects: Objects) -> str:
    volumes = {v["name"]: v for v in _allocation(objects)["spec"]["template"]["spec"]["volumes"]}
    return str(volumes["nvml"]["hostPath"]["path"])


@pytest.mark.parametrize(
    ("components", "host_file"),
    [
        ((), "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        (("nvidia-driver-root",), "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        (("nvidia-arm64",), "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"),
        (
            ("nvidia-driver-root", "nvidia-arm64"),
            "/run/nvidia/driver/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
        ),
        (
            ("nvidia-arm64", "nvidia-driver-root"),
            "/run/nvidia/driver/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
        ),
    ],
)
def test_driver_root_and_arm64_point_the_nvml_mount_at_the_drivers_library(
    components: tuple[str, ...], host_file: str
) -> None:
    objects = _render("overlays/nvidia", *(f"components/{c}" for c in components))
    assert _nvml_host_file(objects) == host_file
    assert not [o for o in objects if o["kind"] == "ConfigMap" and "nvidia" in str(o)], (
        "the components' parameters stay out of the cluster (local-config)"
    )
    _assert_valid(objects, "DaemonSet")


# --- kubelet root ---------------------------------------------------------------------------

KUBELET_ROOTS = {
    "kubelet-root-microk8s": "/var/snap/microk8s/common/var/lib/kubelet",
    "kubelet-root-k0s": "/var/lib/k0s/kubelet",
}


@pytest.mark.parametrize("overlay", ["sim", "nvidia"])
@pytest.mark.parametrize("component", sorted(KUBELET_ROOTS))
def test_kubelet_root_moves_every_kubelet_path_and_the_agent_follows(
    component: str, overlay: str
) -> None:
    root = KUBELET_ROOTS[component]
    objects = _render(f"overlays/{overlay}", f"components/{component}")
    daemonset = _allocation(objects)
    pod = daemonset["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in _container(daemonset)["volumeMounts"]}
    driver = OVERLAYS[overlay][0]
    assert host_paths["plugins-registry"] == f"{root}/plugins_registry"
    assert host_paths["plugin-data"] == f"{root}/plugins/{driver}"
    for name in ("plugins-registry", "plugin-data", "cdi"):
        assert mounts[name] == host_paths[name], "the kubelet dials the paths the agent names"
    config = CONFIG_BUILDERS["allocation"]([], local_env(_resolved_env(daemonset)))
    assert str(config.plugin_registry_dir) == f"{root}/plugins_registry"
    assert str(config.plugin_data_dir) == f"{root}/plugins/{driver}"
    assert not [p for p in host_paths.values() if p.startswith("/var/lib/kubelet/")]
    # The agent refuses socket paths over 107 bytes: MicroK8s' root leaves no room for the uid.
    if component == "kubelet-root-microk8s":
        assert config.rolling_update_uid == ""
        assert daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {
            "maxUnavailable": 1,
            "maxSurge": 0,
        }
    _assert_valid(objects, "DaemonSet")


# --- node selection by Node Feature Discovery ------------------------------------------------

NFD = {"nvidia": ("nfd-nvidia", "10de"), "ascend": ("nfd-ascend", "19e5")}


@pytest.mark.parametrize("with_device_plugin", [False, True])
@pytest.mark.parametrize("overlay", sorted(NFD))
def test_nfd_selects_the_vendors_pci_nodes_and_keeps_other_affinity(
    overlay: str, with_device_plugin: bool
) -> None:
    component, vendor = NFD[overlay]
    components = ["components/device-plugin"] if with_device_plugin else []
    objects = _render(f"overlays/{overlay}", *components, f"components/{component}")
    daemonsets = _of_kind(objects, "DaemonSet")
    assert len(daemonsets) == (4 if with_device_plugin else 3)
    for daemonset in daemonsets:
        pod = daemonset["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {f"feature.node.kubernetes.io/pci-{vendor}.present": "true"}
    if with_device_plugin:  # the two allocation fronts still split the nodes between them
        for name in ("dra-allocation", "dra-allocation-device-plugin"):
            affinity = _one(objects, "DaemonSet", name)["spec"]["template"]["spec"]["affinity"]
            (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ]
            assert term["matchExpressions"][0]["key"] == "dra-suite.io/kubelet-api"
    _assert_valid(objects, "DaemonSet")


# --- the image, its name and tag, and a pull secret ------------------------------------------

_MIRROR = """
images:
- name: ghcr.io/dra-suite/dra-suite
  newName: registry.example.com/infra/dra-suite
  newTag: 0.2.0
"""


def _images(pod: dict[str, Any]) -> list[str]:
    return [c["image"] for c in pod.get("initContainers", []) + pod["containers"]]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_images_rename_every_dra_suite_container_and_each_such_pod_pulls_with_the_secret(
    overlay: str,
) -> None:
    default = render(f"overlays/{overlay}")
    objects = _render(
        f"overlays/{overlay}",
        "components/device-plugin",
        "components/image-pull-secret",
        extra=_MIRROR,
    )
    assert any(IMAGE in i for pod in pod_templates(default).values() for i in _images(pod))
    pods = pod_templates(objects)
    ours = {name for name, pod in pods.items() if any("infra/dra-suite" in i for i in _images(pod))}
    assert {"DaemonSet/dra-allocation-device-plugin", "StatefulSet/nats"} <= ours
    for name, pod in pods.items():
        assert not [i for i in _images(pod) if i.startswith(IMAGE)], name
        if name in ours:
            assert "registry.example.com/infra/dra-suite:0.2.0" in _images(pod)
            assert pod["imagePullSecrets"] == [{"name": "dra-suite-registry"}], name
    _assert_valid(objects, "DaemonSet", "Deployment", "StatefulSet")


# --- OpenShift ------------------------------------------------------------------------------

OPENSHIFT_SCCS = {"privileged", "nonroot-v2"}


def _scc_of(objects: Objects, service_account: str) -> set[str]:
    roles = {r["metadata"]["name"]: r for r in _of_kind(objects, "Role")}
    granted: set[str] = set()
    for binding in _of_kind(objects, "RoleBinding"):
        if {"kind": "ServiceAccount", "name": service_account} not in [
            {"kind": s["kind"], "name": s["name"]} for s in binding["subjects"]
        ]:
            continue
        for rule in roles[binding["roleRef"]["name"]]["rules"]:
            if rule["apiGroups"] == ["security.openshift.io"]:
                assert rule["resources"] == ["securitycontextconstraints"]
                assert rule["verbs"] == ["use"]
                granted |= set(rule["resourceNames"])
    return granted


def _runs_as_root(pod: dict[str, Any]) -> bool:
    pod_user = (pod.get("securityContext") or {}).get("runAsUser")
    return any(
        (c.get("securityContext") or {}).get("runAsUser", pod_user) == 0
        for c in pod.get("initContainers", []) + pod["containers"]
    )


NODE_AGENTS = {"DaemonSet/dra-discovery", "DaemonSet/dra-allocation", "DaemonSet/dra-health"}
"""One grant per account in every overlay: the node agents need `privileged` in nvidia and
ascend (root, privileged containers, hostPath), so they have it in sim too."""


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_openshift_grants_each_pod_the_one_scc_that_admits_it(overlay: str) -> None:
    objects = _render(f"overlays/{overlay}", "components/openshift")
    _assert_rbac_has_no_wildcard(objects)
    for name, pod in pod_templates(objects).items():
        (scc,) = _scc_of(objects, pod.get("serviceAccountName", "default"))
        assert scc in OPENSHIFT_SCCS
        # nonroot-v2 admits what Pod Security's restricted does, with any non-root uid.
        needs_privileged = least_level(pod) != "restricted" or _runs_as_root(pod)
        if needs_privileged or name in NODE_AGENTS:
            assert scc == "privileged", name
        else:
            assert scc == "nonroot-v2", name
    selinux = _container(_allocation(objects))["securityContext"]["seLinuxOptions"]
    assert selinux == {"type": "spc_t"}, "the kubelet plugin writes into host directories"
    _assert_valid(objects, "Role", "RoleBinding", "DaemonSet")


def test_openshift_grants_follow_the_namespace() -> None:
    objects = _render(
        "overlays/sim",
        "components/openshift",
        namespace="gpu-system",
    )
    bindings = [b for b in _of_kind(objects, "RoleBinding") if "scc" in b["metadata"]["name"]]
    assert len(bindings) == 2
    for binding in bindings:
        assert binding["metadata"]["namespace"] == "gpu-system"
        assert {s["namespace"] for s in binding["subjects"]} == {"gpu-system"}


# --- Prometheus Operator ----------------------------------------------------------------------

_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
POD_MONITOR_SCHEMA: dict[str, Any] = {
    # The parts of the PodMonitor CRD (monitoring.coreos.com/v1) these objects use, as the CRD
    # states them: required fields, types, enums and patterns; nothing else is allowed here.
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "additionalProperties": False,
        },
        "spec": {
            "type": "object",
            "required": ["selector"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        },
                        "matchExpressions": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["key", "operator"],
                                "additionalProperties": False,
                                "properties": {
                                    "key": {"type": "string"},
                                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                                    "values": {"type": "array", "items": {"type": "string"}},
                                },
                            },
                        },
                    },
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string", "minLength": 1},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "sourceLabels": {
                                            "type": "array",
                                            "items": {
                                                "type": "string",
                                                "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$",
                                            },
                                        },
                                        "targetLabel": {"type": "string"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
PROMETHEUS_RULE_SCHEMA: dict[str, Any] = {
    # The parts of the PrometheusRule CRD (monitoring.coreos.com/v1) the rule uses, as the CRD
    # states them; nothing else is allowed here.
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": POD_MONITOR_SCHEMA["properties"]["metadata"],
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": {"type": "string", "pattern": _DURATION},
                                        "labels": _STRING_MAP,
                                        "annotations": _STRING_MAP,
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        value, values = labels.get(expression["key"]), expression.get("values", [])
        holds = {
            "In": value in values,
            "NotIn": value not in values,
            "Exists": value is not None,
            "DoesNotExist": value is None,
        }[expression["operator"]]
        if not holds:
            return False
    return True


def _pod_labels(objects: Objects) -> dict[str, tuple[dict[str, str], dict[str, Any]]]:
    return {
        f"{o['kind']}/{o['metadata']['name']}": (
            o["spec"]["template"]["metadata"]["labels"],
            o["spec"]["template"]["spec"],
        )
        for o in objects
        if o["kind"] in ("DaemonSet", "Deployment", "StatefulSet")
    }


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_pod_monitors_are_valid_and_scrape_a_named_port_of_every_agent(overlay: str) -> None:
    objects = _render(
        f"overlays/{overlay}",
        "components/device-plugin",
        "components/prometheus-operator",
        namespace="gpu-system",
    )
    monitors = _of_kind(objects, "PodMonitor")
    assert len(monitors) == 2
    scraped: set[str] = set()
    for monitor in monitors:
        jsonschema.validate(monitor, POD_MONITOR_SCHEMA)
        assert monitor["metadata"]["namespace"] == "gpu-system", "where its pods run"
        matched = {
            name: pod
            for name, (labels, pod) in _pod_labels(objects).items()
            if _selects(monitor["spec"]["selector"], labels)
        }
        assert matched, monitor["metadata"]["name"]
        for name, pod in matched.items():
            ports = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
            for endpoint in monitor["spec"]["podMetricsEndpoints"]:
                assert endpoint["port"] in ports, (name, endpoint)
        scraped |= set(matched)
    assert scraped == {
        *("DaemonSet/dra-discovery", "DaemonSet/dra-allocation", "DaemonSet/dra-health"),
        "DaemonSet/dra-allocation-device-plugin",
        "Deployment/dra-nats-auth",
    }


def test_the_pod_monitor_check_refuses_what_the_crd_refuses() -> None:
    (monitor, _) = _of_kind(_render("overlays/sim", "components/prometheus-operator"), "PodMonitor")
    for broken in (
        {**monitor, "spec": {k: v for k, v in monitor["spec"].items() if k != "selector"}},
        {**monitor, "spec": {**monitor["spec"], "podMetricsEndpoints": [{"port": 9100}]}},
        {**monitor, "spec": {**monitor["spec"], "podMetricsEndpoints": [{"interval": "30 s"}]}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, POD_MONITOR_SCHEMA)


def test_the_prometheus_rule_is_valid_and_in_the_install_namespace() -> None:
    objects = _render("overlays/sim", "components/prometheus-operator", namespace="gpu-system")
    (rule,) = _of_kind(objects, "PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    assert rule["metadata"]["namespace"] == "gpu-system"
    for broken in (
        {**rule, "spec": {"groups": [{"rules": []}]}},
        {**rule, "spec": {"groups": [{"name": "x", "rules": [{"alert": "A", "for": "5 m",
                                                              "expr": "up"}]}]}},
    ):  # fmt: skip
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, PROMETHEUS_RULE_SCHEMA)


# --- priority classes ---------------------------------------------------------------------


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_node_agent_is_system_node_critical(overlay: str) -> None:
    objects = _render(f"overlays/{overlay}", "components/device-plugin")
    for daemonset in _of_kind(objects, "DaemonSet"):
        pod = daemonset["spec"]["template"]["spec"]
        assert pod["priorityClassName"] == "system-node-critical", daemonset["metadata"]["name"]


# --- the documentation --------------------------------------------------------------------


def _docs_text() -> str:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return "\n".join(p.read_text() for p in pages if p.is_file())


def test_every_component_is_documented() -> None:
    text = _docs_text()
    for folder in sorted((KUSTOMIZE / "components").iterdir()):
        assert f"components/{folder.name}" in text, folder.name


def test_the_documented_resources_patch_renders_onto_the_agent() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", _docs_text(), re.DOTALL)
    (block,) = [b for b in blocks if "/spec/template/spec/containers/0/resources" in b]
    objects = _render("overlays/sim", extra=block)
    resources = _container(_allocation(objects))["resources"]
    assert resources == yaml.safe_load(yaml.safe_load(block)["patches"][0]["patch"])[0]["value"]
    _assert_valid(objects, "DaemonSet")


# --- all at once ----------------------------------------------------------------------------

EVERY_OPTION = (
    *("overlays/nvidia/k8s-1.36", "components/cert-manager", "components/device-plugin"),
    *("components/nvidia-driver-root", "components/nvidia-arm64", "components/kubelet-root-k0s"),
    *("components/nfd-nvidia", "components/image-pull-secret", "components/openshift"),
    *("components/prometheus-operator", "components/slice-taints", "components/vfio-passthrough"),
)


def test_every_option_together_renders_valid_objects_the_agents_accept() -> None:
    objects = _render("overlays/nvidia", *EVERY_OPTION, extra=_MIRROR, namespace="gpu-system")
    for obj in objects:
        if is_kubernetes(obj):
            kubernetes_validate.validate(obj, "1.36.0", strict=True)
    for daemonset in _of_kind(objects, "DaemonSet"):
        agent = _container(daemonset)["name"].removesuffix("-device-plugin")
        env = _resolved_env(daemonset)
        assert env["NATS_URL"].startswith("tls://nats.gpu-system.svc"), env["NATS_URL"]
        config = CONFIG_BUILDERS[agent]([], local_env(env))
        assert config.driver_name == "gpu.dra-suite.io"
    allocation = _allocation(objects)
    assert _nvml_host_file(objects).startswith("/run/nvidia/driver/usr/lib/aarch64-linux-gnu/")
    assert allocation["spec"]["template"]["spec"]["imagePullSecrets"]
    assert _container(allocation)["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    assert _container(allocation)["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}
    mounts = {m["mountPath"] for m in _container(allocation)["volumeMounts"]}
    assert {"/sys/bus/pci", "/sys/devices"} <= mounts
