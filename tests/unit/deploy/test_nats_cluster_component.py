"""The nats-cluster Component: NATS as a 3-server JetStream cluster (parallel StatefulSet, one
server per node, a PVC each, a PodDisruptionBudget), composed with the base's auth callout and
TLS; routes with mutual TLS of their own, fenced to the nats pods; agents get every server URL
and 3 replicas. Every overlay renders valid, and three real nats-servers on the rendered config
form a cluster, which a server with a certificate from another CA cannot join."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import trustme

from devcluster.natscluster import free_port
from devcluster.natsserver import NATSServerProcess
from shared.bus import streams
from shared.bus.subjects import Names
from tests.unit.deploy.manifests import (
    CONFIG_BUILDERS,
    KUBE_VERSIONS,
    KUBECTL,
    OVERLAYS,
    _container,
    _env,
    _of_kind,
    _resolved_env,
    is_kubernetes,
    local_env,
    render,
)
from tests.unit.deploy.test_cert_manager_component import SCHEMAS as CERT_MANAGER_SCHEMAS
from tests.unit.deploy.test_secure_bus import _issuer_public_key, _public_curve_key

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")

COMPONENT = "components/nats-cluster"
CERT_MANAGER = "components/cert-manager"
SERVERS = [f"nats-{i}.nats-headless" for i in range(3)]
ROUTE_SECRET = "dra-suite-nats-route-tls"
BUS_LABELS = {"app.kubernetes.io/name": "nats", "app.kubernetes.io/component": "bus"}
Obj = dict[str, Any]


def _one(objects: tuple[Obj, ...], kind: str, name: str) -> Obj:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _config(objects: tuple[Obj, ...]) -> str:
    return str(_one(objects, "ConfigMap", "nats-config")["data"]["nats.conf"])


def _clustered(overlay: str = "sim") -> tuple[Obj, ...]:
    return render(f"overlays/{overlay}", (CERT_MANAGER, COMPONENT))


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_with_the_component_is_valid_kubernetes(overlay: str, version: str) -> None:
    for components in ((COMPONENT,), (CERT_MANAGER, COMPONENT)):
        for obj in render(f"overlays/{overlay}", components):
            if is_kubernetes(obj):
                kubernetes_validate.validate(obj, version, strict=True)


def test_three_servers_start_together_one_per_node_with_a_volume_each() -> None:
    objects = _clustered()
    nats = _one(objects, "StatefulSet", "nats")
    spec = nats["spec"]
    assert (spec["replicas"], spec["podManagementPolicy"]) == (3, "Parallel")
    (spread,) = spec["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert (spread["maxSkew"], spread["whenUnsatisfiable"]) == (1, "DoNotSchedule")
    assert spread["labelSelector"]["matchLabels"] == BUS_LABELS
    (claim,) = spec["volumeClaimTemplates"]
    assert {m["name"] for m in _container(nats)["volumeMounts"]} >= {claim["metadata"]["name"]}
    budget = _one(objects, "PodDisruptionBudget", "nats")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": BUS_LABELS}}
    headless = _one(objects, "Service", "nats-headless")
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]}["route"] == 6222
    assert _env(nats)["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def _account_bound_apart(config: str) -> str:
    """The config without the app account's `max_file` line and the comment above it (the one
    bound a cluster scales, by its replicas)."""
    return re.sub(r"\n *# Bounds for the whole app account.*?max_file: \S+", "", config, flags=re.S)


def _max_file_bytes(config: str) -> int:
    found = re.search(r"max_file: (\d+)MB", config)
    assert found is not None
    return int(found[1]) * 1024 * 1024


def test_the_config_is_the_base_one_with_routes_over_mutual_tls() -> None:
    base = _account_bound_apart(_config(render("overlays/sim")))
    clustered = _account_bound_apart(_config(_clustered()))
    assert clustered.startswith(base), "auth callout, accounts and client TLS stay as in the base"
    cluster = clustered.removeprefix(base)
    assert "server_name: $POD_NAME" in cluster
    assert re.findall(r"nats-route://(\S+)", cluster) == [f"{s}:6222" for s in SERVERS]
    assert "no_advertise: true" in cluster
    tls = re.search(r"tls \{(.*?)\}", cluster, re.S)
    assert tls is not None
    assert "verify: true" in tls[1]
    nats = _one(_clustered(), "StatefulSet", "nats")
    mounts = {m["mountPath"]: m for m in _container(nats)["volumeMounts"]}
    volumes = {v["name"]: v for v in nats["spec"]["template"]["spec"]["volumes"]}
    for path in re.findall(r"(?:cert|key|ca)_file: (\S+)", tls[1]):
        mount = mounts[str(Path(path).parent)]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["secret"]["secretName"] == ROUTE_SECRET
    assert "authorization" not in cluster, "routes authenticate by certificate only"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agents_get_every_server_and_three_replicas(overlay: str) -> None:
    objects = _clustered(overlay)
    urls = [f"tls://{s}.dra-suite.svc:4222" for s in SERVERS]
    for ds in _of_kind(objects, "DaemonSet"):
        agent = _container(ds)["name"]
        config = CONFIG_BUILDERS[agent]([], local_env(_resolved_env(ds)))
        assert config.nats.url.split(",") == urls
        assert config.nats.replicas == 3
    auth = _one(objects, "Deployment", "dra-nats-auth")
    assert _resolved_env(auth)["NATS_URL"].split(",") == urls
    # The client certificate covers every name the clients dial.
    names = _one(objects, "Certificate", "dra-suite-nats")["spec"]["dnsNames"]
    assert {u.split("//")[1].split(":")[0] for u in urls} <= set(names)
    for obj in objects:
        if obj["apiVersion"].startswith("cert-manager.io/"):
            jsonschema.validate(obj, CERT_MANAGER_SCHEMAS[obj["kind"]])
    alone = render(f"overlays/{overlay}", (CERT_MANAGER,))
    assert set(_one(alone, "Certificate", "dra-suite-nats")["spec"]["dnsNames"]) <= set(names)


@pytest.mark.parametrize("clustered", [False, True], ids=["base", "nats-cluster"])
def test_the_app_account_holds_every_stream_the_provisioner_makes(clustered: bool) -> None:
    # A cluster counts each replica of a stream's max_bytes against the account's max_file:
    # an account bound below that refuses the first bucket.
    objects = _clustered() if clustered else render("overlays/sim")
    (ds, *_) = _of_kind(objects, "DaemonSet")
    replicas = int(_env(ds)["NATS_REPLICAS"]["value"])
    assert replicas == (3 if clustered else 1)
    reserved = sum(
        config["max_bytes"] * config["num_replicas"]
        for config in streams.all_streams(Names(""), replicas=replicas)
    )
    assert reserved <= _max_file_bytes(_config(objects))


def test_without_the_component_agents_keep_one_replica() -> None:
    for ds in _of_kind(render("overlays/sim", ("components/device-plugin",)), "DaemonSet"):
        assert _env(ds)["NATS_REPLICAS"]["value"] == "1"


def test_only_nats_servers_reach_the_route_port() -> None:
    policy = _one(_clustered(), "NetworkPolicy", "nats-clients")
    rules = [r for r in policy["spec"]["ingress"] if any(p["port"] == 6222 for p in r["ports"])]
    assert rules == [
        {
            "from": [{"podSelector": {"matchLabels": BUS_LABELS}}],
            "ports": [{"protocol": "TCP", "port": 6222}],
        }
    ]
    client_rules = [r for r in policy["spec"]["ingress"] if r not in rules]
    base = _one(render("overlays/sim"), "NetworkPolicy", "nats-clients")
    assert client_rules == base["spec"]["ingress"], "the clients' rule stays the base's"


# --- the rendered config on three real nats-servers --------------------------------------------


def _local_config(
    config: str, *, tls: Path, route_tls: Path, monitor: int, route_port: int, routes: list[int]
) -> str:
    """The rendered config with the pod's paths, ports and peers made local."""
    rewrites = {
        "/etc/nats/tls/": f"{tls}/",
        "/etc/nats/route-tls/": f"{route_tls}/",
        'http: "127.0.0.1:8222"\n': f'http: "127.0.0.1:{monitor}"\n',
        "store_dir: /data\n": "",  # the harness gives it as a flag
        "  port: 6222\n": f"  port: {route_port}\n",
    }
    for server, port in zip(SERVERS, routes, strict=True):
        rewrites[f"nats-route://{server}:6222"] = f"nats-route://localhost:{port}"
    for old, new in rewrites.items():
        assert old in config, old
        config = config.replace(old, new)
    return config


def _write_pair(cert: trustme.LeafCert, ca: trustme.CA, folder: Path) -> Path:
    folder.mkdir()
    cert.private_key_pem.write_to_path(str(folder / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(folder / "tls.crt"))
    ca.cert_pem.write_to_path(str(folder / "ca.crt"))
    return folder


def _routes(monitor: int) -> int:
    """How many peers the server has routes to (several connections each: route pooling)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/routez", timeout=2) as answer:
        return len({route["remote_id"] for route in json.load(answer)["routes"] or []})


def _wait(check: Any, *, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.2)


def _start(config: str, folder: Path, *, name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    folder.mkdir(exist_ok=True)
    (folder / "nats.conf").write_text(config)
    monkeypatch.setenv("POD_NAME", name)
    server = NATSServerProcess(folder / "store", extra_args=("--config", str(folder / "nats.conf")))
    server.start()
    return server


@pytest.mark.integration
def test_three_servers_on_the_rendered_config_form_a_cluster_a_stranger_cannot_join(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NATS_CALLOUT_ISSUER", _issuer_public_key())
    monkeypatch.setenv("NATS_CALLOUT_XKEY", _public_curve_key())
    monkeypatch.setenv("NATS_CALLOUT_AUTH_PASSWORD", "auth-service-password")
    monkeypatch.setenv("NATS_CALLOUT_SYS_PASSWORD", "sysPassword")
    client_ca, route_ca, stranger_ca = trustme.CA(), trustme.CA(), trustme.CA()
    tls = _write_pair(client_ca.issue_cert("localhost"), client_ca, tmp_path / "tls")
    route_tls = _write_pair(route_ca.issue_cert("localhost"), route_ca, tmp_path / "route-tls")
    stranger_tls = _write_pair(
        stranger_ca.issue_cert("localhost"), route_ca, tmp_path / "stranger-tls"
    )
    rendered = _config(_clustered())
    route_ports = [free_port() for _ in SERVERS]
    monitors = [free_port() for _ in range(len(SERVERS) + 1)]
    configs = [
        _local_config(
            rendered, tls=tls, route_tls=route_tls, monitor=m, route_port=r, routes=route_ports
        )
        for m, r in zip(monitors, route_ports, strict=False)
    ]
    servers = []
    try:
        for index, config in enumerate(configs):
            servers.append(
                _start(
                    config, tmp_path / f"n{index}", name=f"nats-{index}", monkeypatch=monkeypatch
                )
            )
        _wait(lambda: all(_routes(m) == 2 for m in monitors[:3]))
        # A fourth server whose route certificate another CA signed: every member refuses it.
        stranger = _local_config(
            rendered,
            tls=tls,
            route_tls=stranger_tls,
            monitor=monitors[3],
            route_port=free_port(),
            routes=route_ports,
        )
        servers.append(_start(stranger, tmp_path / "n3", name="nats-3", monkeypatch=monkeypatch))
        time.sleep(2.0)  # nats-server retries routes every second
        assert [_routes(m) for m in monitors] == [2, 2, 2, 0]
    finally:
        for server in servers:
            server.stop()
