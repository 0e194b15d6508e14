"""What the deployment tests share: the manifests under deploy/kustomize, loaded once (and
rendered with kubectl), and the expectations (overlays, agent env, each agent's access to its
node per overlay, RBAC, the secured bus) they are checked against."""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import trustme
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from services.allocation import cli as allocation_cli
from services.discovery import cli as discovery_cli
from services.health import cli as health_cli
from services.natsauth import secrets as natsauth_secrets
from tests.unit.deploy import cel_quantity

REPO = Path(__file__).resolve().parents[3]
KUSTOMIZE = REPO / "deploy" / "kustomize"
KUBE_VERSIONS = ("1.34.0", "1.35.0", "1.36.0")
OVERLAYS = {  # overlay -> (DRIVER_NAME, BACKEND and MONITOR)
    "sim": ("sim.dra-suite.io", "sim"),
    "nvidia": ("gpu.dra-suite.io", "nvml"),
    "ascend": ("npu.huawei.com", "ascend"),
}
NATS_AUTH_ENV = {  # secrets only as files (a mounted Secret): never NATS_PASSWORD or NATS_TOKEN
    *("NATS_USER", "NATS_PASSWORD_FILE", "NATS_TOKEN_FILE", "NATS_NKEY_SEED_FILE"),
    *("NATS_CREDS_FILE", "NATS_TLS_CA_FILE", "NATS_TLS_CERT_FILE", "NATS_TLS_KEY_FILE"),
}
BUS_SIGNATURES_ENV = {"BUS_SIGNATURES", "BUS_AUTH_KEY_FILE"}
_COMMON = {
    *("NODE_NAME", "DRIVER_NAME", "NATS_URL", "KUBECONFIG"),
    *("LOG_LEVEL", "LOG_FORMAT", "OPS_PORT", "NATS_REPLICAS"),
    *NATS_AUTH_ENV,
    *BUS_SIGNATURES_ENV,
}
AGENT_ENV = {  # what the deployments may set: env twins of each agent's flags
    "discovery": _COMMON
    | {"OTLP_ENDPOINT", "BACKEND", "SIM_PROFILE", "MIG_PROFILES", "PUBLISH_PCI_BUS_ID"}
    | {"PUBLISH_DEVICE_TAINTS", "PUBLISH_SLICES"},
    "allocation": _COMMON
    | {"OTLP_ENDPOINT", "PLUGIN_REGISTRY_DIR", "PLUGIN_DATA_DIR", "CDI_ROOT", "ROLLING_UPDATE_UID"}
    | {"BACKEND"}
    | {"NPU_SMI_PATH", "PARTITION_TIMEOUT_S"}
    | {"KUBELET_API", "DEVICE_PLUGIN_DIR", "DEVICE_PLUGIN_RESOURCES"},
    "health": _COMMON | {"OTLP_ENDPOINT", "MONITOR", "SIM_PROFILE", "TAINT_TARGET"},
}
# Read by the dynamic loader or the NVIDIA container runtime for the real backends.
RUNTIME_ENV = {"LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
EXPANSION_ENV = {"POD_NAMESPACE"}
"""Set only for the kubelet's $(VAR) expansion of other values (Service names in the pod's
namespace); no program reads it."""
_NVIDIA_TOOLKIT = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
_ASCEND_LIBS = {
    "LD_LIBRARY_PATH": "/usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64/common"
    ":/usr/local/Ascend/driver/lib64/driver"
}
OVERLAY_RUNTIME_ENV: dict[str, dict[str, dict[str, str]]] = {  # overlay -> agent -> env
    "sim": {"discovery": {}, "allocation": {}, "health": {}},
    # Discovery and health get NVML and the GPUs from the NVIDIA Container Toolkit. The
    # allocation agent keeps the toolkit out ("void": its tmpfs over /proc/driver/nvidia would
    # hide the MIG instances it makes) and loads the host's libnvidia-ml.so.1 itself.
    "nvidia": {
        "discovery": _NVIDIA_TOOLKIT,
        "allocation": {"NVIDIA_VISIBLE_DEVICES": "void", "LD_LIBRARY_PATH": "/opt/nvml"},
        "health": _NVIDIA_TOOLKIT,
    },
    "ascend": dict.fromkeys(("discovery", "allocation", "health"), _ASCEND_LIBS),
}


@dataclass(frozen=True, slots=True)
class HostMount:
    host_path: str
    mount_path: str
    read_only: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeAccess:
    """What one agent's pod may do on its node, as the rendered overlay must grant it."""

    privileged: bool = False
    root: bool = False
    writable_root_fs: bool = False
    host_mounts: frozenset[HostMount] = frozenset()


def _same_path(*paths: str, read_only: bool) -> frozenset[HostMount]:
    return frozenset(HostMount(p, p, read_only) for p in paths)


def _kubelet_dirs(overlay: str) -> frozenset[HostMount]:
    """The registry, this driver's own plugin directory (not the whole plugins dir) and CDI."""
    driver = OVERLAYS[overlay][0]
    return _same_path(
        *("/var/lib/kubelet/plugins_registry", f"/var/lib/kubelet/plugins/{driver}"),
        "/var/run/cdi",
        read_only=False,
    )


_NPU_SMI = _same_path("/usr/local/Ascend/driver", "/usr/local/bin/npu-smi", read_only=True)
_HOST_DEV = _same_path("/dev", read_only=False)
NVML_HOST_FILE = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
NODE_ACCESS: dict[str, dict[str, NodeAccess]] = {  # overlay -> agent -> access
    # The sim overlay touches no hardware: only the kubelet plugin (root-owned host dirs) runs
    # as root, nothing is privileged.
    "sim": {
        "discovery": NodeAccess(),
        "allocation": NodeAccess(root=True, host_mounts=_kubelet_dirs("sim")),
        "health": NodeAccess(),
    },
    # NVML queries of MIG placements need root; only making MIG instances needs privileges.
    "nvidia": {
        "discovery": NodeAccess(root=True),
        "allocation": NodeAccess(
            privileged=True,
            root=True,
            host_mounts=_kubelet_dirs("nvidia")
            | _HOST_DEV
            | {HostMount(NVML_HOST_FILE, "/opt/nvml/libnvidia-ml.so.1", read_only=True)},
        ),
        "health": NodeAccess(root=True),
    },
    # npu-smi opens the davinci control devices (privileged root) and writes its own logs.
    "ascend": {
        "discovery": NodeAccess(
            privileged=True,
            root=True,
            writable_root_fs=True,
            host_mounts=_NPU_SMI | _HOST_DEV | _same_path("/sys", read_only=True),
        ),
        "allocation": NodeAccess(
            privileged=True,
            root=True,
            writable_root_fs=True,
            host_mounts=_kubelet_dirs("ascend") | _NPU_SMI | _HOST_DEV,
        ),
        "health": NodeAccess(
            privileged=True,
            root=True,
            writable_root_fs=True,
            host_mounts=_NPU_SMI | _HOST_DEV | _same_path("/sys", read_only=True),
        ),
    },
}
# The secured bus (interfaces.md "Bus identities"): names fixed across the team.
BUS_AUDIENCE = "nats.dra-suite.io"
TOKEN_FILE = "/var/run/secrets/dra-suite/nats/token"
CA_FILE = "/etc/dra-suite/nats-tls/ca.crt"
TLS_SECRET = "dra-suite-nats-tls"
CA_CONFIGMAP = "dra-suite-nats-ca"
"""The CA certificate alone (`ca.crt` of the TLS Secret), which every client of the bus mounts:
a Secret volume would let the node read the server's key."""
CALLOUT_SECRET = "dra-suite-nats-callout"
CALLOUT_KEYS = {
    "issuer.seed",
    "issuer.pub",
    "xkey.seed",
    "xkey.pub",
    "auth-password",
    "sys-password",
    "certify.seed",
    "certify.pub",
}
AUTH_KEY_FILE = "/etc/dra-suite/bus-auth-key/certify.pub"
AUTH_KEY_CONFIGMAP = "dra-suite-bus-auth-key"
"""The auth service's public certify key (`certify.pub` of the callout Secret), which every agent
checks signed records against (docs/security.md "Signed records")."""
AUTH_SERVICE_ENV = {  # env twins of dra-nats-auth's flags (interfaces.md)
    *("NATS_URL", "NATS_USER", "NATS_PASSWORD_FILE", "NATS_TLS_CA_FILE", "NATS_NAMESPACE"),
    *("ISSUER_SEED_FILE", "XKEY_SEED_FILE", "AUDIENCE", "TARGET_ACCOUNT", "AGENT_NAMESPACE"),
    *("OPERATOR_USERS", "OPERATOR_GROUPS", "DRIVER_NAME", "OPS_PORT", "KUBECONFIG"),
    *("LOG_LEVEL", "LOG_FORMAT", "SYS_USER", "SYS_PASSWORD_FILE", "REVOCATIONS_CONFIGMAP"),
    "CERTIFY_SEED_FILE",
}
AGENT_SHUTDOWN_S = 10
CEL_DRIVER = re.compile(r'device\.driver\s*==\s*"([^"]+)"')
CEL_DOMAIN = re.compile(r'device\.(?:attributes|capacity)\["([^"]+)"\]')
KUBECTL = shutil.which("kubectl")

# --- loading ------------------------------------------------------------------------------


@functools.cache
def _docs(path: Path) -> tuple[dict[str, Any], ...]:
    return tuple(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d)


def _safe_docs(path: Path) -> tuple[dict[str, Any], ...]:
    """For collection: a broken file fails test_every_yaml_file_parses, not the whole run."""
    try:
        return _docs(path)
    except yaml.YAMLError:
        return ()


KUSTOMIZATIONS = sorted(KUSTOMIZE.rglob("kustomization.yaml"))
PATCH_FILES = {
    (k.parent / p["path"]).resolve()
    for k in KUSTOMIZATIONS
    for d in _safe_docs(k)
    for p in d.get("patches", [])
    if "path" in p  # not the inline ones
}
MANIFESTS = sorted(p for p in KUSTOMIZE.rglob("*.y*ml") if p.name != "kustomization.yaml")


def _name(doc: dict[str, Any]) -> str:
    return str((doc.get("metadata") or {}).get("name"))


def is_kubernetes(doc: dict[str, Any]) -> bool:
    """False for objects no Kubernetes schema knows: cert-manager's, the Prometheus Operator's
    (test_install_components checks them), KubeVirt's (test_vfio_example checks them),
    kustomize's own plugins."""
    return not str(doc.get("apiVersion", "")).startswith(
        ("cert-manager.io/", "monitoring.coreos.com/", "kubevirt.io/", "builtin")
    )


def _entries(*, patches: bool) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.relative_to(KUSTOMIZE)}#{i}:{doc.get('kind')}/{_name(doc)}", doc)
        for path in MANIFESTS
        if (path.resolve() in PATCH_FILES) == patches
        for i, doc in enumerate(_safe_docs(path))
    ]


ALL_OBJECTS = _entries(patches=False)
OBJECTS = [(n, d) for n, d in ALL_OBJECTS if is_kubernetes(d)]
"""What the Kubernetes schemas validate; cert-manager objects are checked on their own."""
PATCHES = _entries(patches=True)
AGENT_OBJECTS = [(n, d) for n, d in OBJECTS if not n.startswith("examples/")]
"""What installs dra-suite itself: everything but the examples (which have a DaemonSet too)."""
DAEMONSETS = [
    (n, d)
    for n, d in AGENT_OBJECTS + PATCHES
    if d.get("kind") == "DaemonSet" and "containers" in d["spec"]["template"]["spec"]
]
"""Every agent DaemonSet and every patch of one agent's; not the patches of pod fields that
components apply to all DaemonSets (node selector, pull secret)."""
BASE_DAEMONSETS = [(n, d) for n, d in AGENT_OBJECTS if d.get("kind") == "DaemonSet"]


def _of_kind(docs: Any, kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def _container(ds: dict[str, Any]) -> dict[str, Any]:
    containers = ds["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, "one agent per DaemonSet, so each rolls on its own"
    return dict(containers[0])


def _env(ds: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in _container(ds).get("env", [])}


def _ids(entries: list[tuple[str, Any]]) -> list[str]:
    return [name for name, _ in entries]


def _assert_rbac_has_no_wildcard(docs: Any) -> None:
    for role in _of_kind(docs, "ClusterRole") + _of_kind(docs, "Role"):
        for rule in role.get("rules", []):
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert not any("*" in v for v in rule.get(key, [])), (role["metadata"], rule)


def _assert_env_names_are_flags(ds: dict[str, Any]) -> None:
    agent = _container(ds)["name"]
    unknown = set(_env(ds)) - AGENT_ENV[agent] - RUNTIME_ENV - EXPANSION_ENV
    assert not unknown, f"{agent}: env names that are no agent flag: {sorted(unknown)}"


# Each agent's config, built from flags and env twins as its cli does.
CONFIG_BUILDERS: dict[str, Callable[[list[str], Mapping[str, str]], Any]] = {
    "discovery": discovery_cli.parse_config,
    "allocation": allocation_cli.build_config,
    "health": health_cli.parse,
}


# What the kubelet fills in from the downward API, for the env resolution below.
_DOWNWARD_API = {
    "spec.nodeName": "node-a",
    "metadata.uid": "6f1c0a6e-3b1f-4d1e-9a55-1b2c3d4e5f60",
    # An annotation no pod has: empty (components/kubelet-root-microk8s turns rolling updates off).
    "metadata.annotations['dra-suite.io/rolling-update-uid']": "",
}


def _resolved_env(ds: dict[str, Any]) -> dict[str, str]:
    """The env the kubelet would give the container: downward API filled, $(VAR) expanded."""
    env: dict[str, str] = {}
    for entry in _container(ds).get("env", []):
        if "valueFrom" in entry:
            field = entry["valueFrom"]["fieldRef"]["fieldPath"]
            known = {**_DOWNWARD_API, "metadata.namespace": ds["metadata"]["namespace"]}
            assert field in known, f"unexpected downward API field {field}"
            env[entry["name"]] = known[field]
        else:
            env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], entry["value"])
    return env


@functools.cache
def stand_in_files() -> dict[str, str]:
    """Local files for the paths the pods read their bus credentials from (the projected token,
    the CA certificate, the auth service's certify key): the agents read and check them when
    they parse their config."""
    folder = Path(tempfile.mkdtemp(prefix="dra-deploy-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    (folder / "token").write_text("projected-service-account-token\n")
    trustme.CA().cert_pem.write_to_path(str(folder / "ca.crt"))
    (folder / "certify.pub").write_text(natsauth_secrets.material()["certify.pub"] + "\n")
    return {
        TOKEN_FILE: str(folder / "token"),
        CA_FILE: str(folder / "ca.crt"),
        AUTH_KEY_FILE: str(folder / "certify.pub"),
    }


def local_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the mounted files' paths replaced by local stand-ins."""
    files = stand_in_files()
    return {name: files.get(value, value) for name, value in env.items()}


def _assert_agent_accepts(agent: str, env: Mapping[str, str]) -> None:
    """The agent builds its config from `env`, the mounted files stood in by local ones."""
    config = CONFIG_BUILDERS[agent]([], local_env(env))
    assert (config.node_name, config.driver_name) == (env["NODE_NAME"], env["DRIVER_NAME"])


def node_access(ds: dict[str, Any]) -> NodeAccess:
    """What a (rendered) DaemonSet grants its agent on the node."""
    pod, container = ds["spec"]["template"]["spec"], _container(ds)
    pod_context, context = pod.get("securityContext", {}), container.get("securityContext", {})
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = frozenset(
        HostMount(volumes[m["name"]]["hostPath"]["path"], m["mountPath"], m.get("readOnly", False))
        for m in container.get("volumeMounts", [])
        if "hostPath" in volumes[m["name"]]
    )
    return NodeAccess(
        privileged=context.get("privileged", False),
        root=context.get("runAsUser", pod_context.get("runAsUser")) == 0,
        writable_root_fs=not context.get("readOnlyRootFilesystem", False),
        host_mounts=mounts,
    )


@functools.cache
def render(
    target: str, components: tuple[str, ...] = (), *, namespace: str = ""
) -> tuple[dict[str, Any], ...]:
    """`kubectl kustomize` of a folder under deploy/kustomize; with `components` (folders
    under deploy/kustomize too) or a `namespace`, of a kustomization that adds them to it, as a
    user's would (another namespace with deploy/kustomize/namespace as its transformer)."""
    assert KUBECTL is not None
    with tempfile.TemporaryDirectory() as tmp:
        folder = KUSTOMIZE / target
        if components or namespace:
            kustomization: dict[str, Any] = {
                "resources": [os.path.relpath(folder, tmp)],
                "components": [os.path.relpath(KUSTOMIZE / c, tmp) for c in components],
            }
            if namespace:
                kustomization["namespace"] = namespace
                kustomization["transformers"] = [os.path.relpath(KUSTOMIZE / "namespace", tmp)]
            Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
            folder = Path(tmp)
        result = subprocess.run(
            [KUBECTL, "kustomize", str(folder)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


# --- examples and DeviceClasses, as the CEL and admission tests read them -----------------

EXAMPLE_FILES = sorted((KUSTOMIZE / "examples").rglob("*.yaml"))
"""Every example manifest, those for 1.36 in examples/k8s-1.36 included."""
COMPONENTS = {o: KUSTOMIZE / "overlays" / o / "k8s-1.36" for o in OVERLAYS}
"""Per overlay: the kustomize Component with what needs Kubernetes 1.36 defaults."""


def _example_objects() -> list[dict[str, Any]]:
    return [d for p in EXAMPLE_FILES if p.name != "kustomization.yaml" for d in _safe_docs(p)]


def _claim_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The claim spec of a ResourceClaim or ResourceClaimTemplate; None for other kinds."""
    if doc.get("kind") == "ResourceClaim":
        return dict(doc["spec"])
    if doc.get("kind") == "ResourceClaimTemplate":
        return dict(doc["spec"]["spec"])
    return None


def _overlay_classes(overlay: str) -> dict[str, dict[str, Any]]:
    docs = _safe_docs(KUSTOMIZE / "overlays" / overlay / "deviceclasses.yaml")
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == "DeviceClass"}


# --- admission policies, evaluated as kube-apiserver would (CEL through celpy) ------------

ADMISSION = KUSTOMIZE / "admission"
DISCOVERY_USER = "system:serviceaccount:dra-suite:dra-discovery"
NODE_KEY = "authentication.kubernetes.io/node-name"
SIM = "sim.dra-suite.io"


@dataclass(frozen=True, slots=True)
class Verdict:
    matched: bool
    denials: tuple[str, ...]

    @property
    def allowed(self) -> bool:
        return not self.denials


def admission_policy(path: str, name: str) -> dict[str, Any]:
    (found,) = [
        d
        for d in _docs(ADMISSION / path)
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name
    ]
    return found


def policy_with_driver(policy: dict[str, Any], driver: str) -> dict[str, Any]:
    """The policy as an overlay's kustomize replacement leaves it."""
    variables = [
        {**v, "expression": f"'{driver}'"} if v["name"] == "driver" else v
        for v in policy["spec"]["variables"]
    ]
    return {**policy, "spec": {**policy["spec"], "variables": variables}}


@functools.cache
def _program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression), functions=cel_quantity.FUNCTIONS)


def compile_policy(policy: dict[str, Any]) -> None:
    """Compile every expression of `policy` now: celpy's compiler raises the recursion limit,
    which hypothesis refuses to see done inside a test."""
    spec = policy["spec"]
    for entry in [*spec.get("matchConditions", []), *spec["variables"], *spec["validations"]]:
        for key in ("expression", "messageExpression"):
            if key in entry:
                _program(entry[key])


def _run_cel(expression: str, activation: dict[str, Any]) -> Any:
    result = _program(expression).evaluate(activation)
    if isinstance(result, CELEvalError):
        raise result
    return result


def evaluate_policy(policy: dict[str, Any], request: dict[str, Any]) -> Verdict:
    """What the API server decides for `request` under `policy` (bound with Deny)."""
    spec = policy["spec"]
    activation: dict[str, Any] = {
        "request": json_to_cel(request),
        "object": json_to_cel(request.get("object")),
        "oldObject": json_to_cel(request.get("oldObject")),
    }
    for condition in spec.get("matchConditions", []):
        if not _run_cel(condition["expression"], activation):
            return Verdict(matched=False, denials=())
    variables: dict[Any, Any] = {}
    for variable in spec.get("variables", []):
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = _run_cel(
            variable["expression"], activation
        )
    activation["variables"] = celtypes.MapType(variables)
    denials = []
    for validation in spec["validations"]:
        try:
            if _run_cel(validation["expression"], activation):
                continue
        except (CELEvalError, TypeError, ValueError) as exc:
            denials.append(f"error: {exc}")
            continue
        message = validation.get("message")
        if "messageExpression" in validation:
            message = str(_run_cel(validation["messageExpression"], activation))
        denials.append(" ".join(str(message).split()))
    return Verdict(matched=True, denials=tuple(denials))


def admission_request(
    *,
    resource: str,
    operation: str,
    obj: Any,
    old: Any = None,
    user: str = DISCOVERY_USER,
    extra: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    user_info: dict[str, Any] = {"username": user, "groups": ["system:serviceaccounts"]}
    if extra is not None:
        user_info["extra"] = extra
    return {
        "uid": "0e4c5b7e-0000-4000-8000-000000000001",
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": resource},
        "operation": operation,
        "userInfo": user_info,
        "object": obj,
        "oldObject": old,
    }
