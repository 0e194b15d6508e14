"""The sim overlay's bus, run as rendered: nats-server on the rendered config, dra-nats-auth on
the rendered Deployment's env, the Secret from `dra-nats-auth keygen` and the ConfigMap of its
`certify.pub` (as docs/install.md makes them), the ServiceAccounts, pods and tokens as the
rendered objects name them (TokenRequest on the API emulator, audience from the DaemonSets'
projected volume). An agent that parses its DaemonSet's env gets in over TLS, has its writer key
certified and works its own key with signed records enforced; the operator's token gets in; a
token for another audience, a pod of another account and a client without TLS do not. Only
addresses and the pods' file paths are made local."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import nats
import nats.aio.client
import pytest
import trustme
import yaml

from devcluster.apiserver import APIServerEmulator
from devcluster.apiserver.config import ClusterConfig
from devcluster.natsserver import NATSServerProcess
from services.natsauth import cli as auth_cli
from services.natsauth.agent import AuthService
from shared import signature_settings
from shared.supervisor import run_agent
from tests.integration.security.callout_stack import connected
from tests.unit.deploy.manifests import (
    AUTH_KEY_CONFIGMAP,
    CA_CONFIGMAP,
    CONFIG_BUILDERS,
    KUBECTL,
    OBJECTS,
    TLS_SECRET,
    _container,
    _of_kind,
    _resolved_env,
    render,
)

pytestmark = pytest.mark.integration

NODE = "node-a"
Obj = dict[str, Any]


def _base() -> tuple[Obj, ...]:
    return tuple(d for name, d in OBJECTS if name.startswith("base/"))


def _one(objects: tuple[Obj, ...], kind: str, name: str) -> Obj:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _keygen_secret() -> Obj:
    """The callout Secret exactly as docs/install.md has it made."""
    result = subprocess.run(
        [sys.executable, "-m", "services.natsauth", "keygen", "--namespace", "dra-suite"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    secret: Obj = yaml.safe_load(result.stdout)
    return secret


def _files_of(
    workload: Obj, objects: Mapping[str, Mapping[str, str]], folder: Path
) -> dict[str, str]:
    """Pod path -> local file for every Secret and ConfigMap item the container mounts (content
    from `objects`, by name), so that the container's `*_FILE` env can point at them."""
    pod, container = workload["spec"]["template"]["spec"], _container(workload)
    volumes = {v["name"]: v for v in pod["volumes"]}
    local: dict[str, str] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})  # a claim template: none
        if "secret" in volume:
            name, items = volume["secret"]["secretName"], volume["secret"]["items"]
        elif volume.get("configMap", {}).get("name") in objects:  # not the server's config
            name, items = volume["configMap"]["name"], volume["configMap"]["items"]
        else:
            continue
        for item in items:
            path = folder / mount["name"] / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(objects[name][item["key"]])
            local[f"{mount['mountPath']}/{item['path']}"] = str(path)
    return local


def _token_path(workload: Obj) -> tuple[str, str]:
    """(pod path of the projected token, its audience)."""
    pod, container = workload["spec"]["template"]["spec"], _container(workload)
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        projected = volumes[mount["name"]].get("projected")
        if projected:
            (source,) = projected["sources"]
            token = source["serviceAccountToken"]
            return f"{mount['mountPath']}/{token['path']}", token["audience"]
    raise AssertionError("no projected token")


async def _token(kube: APIServerEmulator, *, pod: Obj, audience: str) -> str:
    """What the kubelet writes into the projected volume: a TokenRequest bound to the pod."""
    meta = pod["metadata"]
    spec = {
        "audiences": [audience],
        "expirationSeconds": 3600,
        "boundObjectRef": {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": meta["name"],
            "uid": meta["uid"],
        },
    }
    account = pod["spec"]["serviceAccountName"]
    url = f"{kube.url}/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as answer:
        reply = await answer.json()
        assert answer.status == 201, reply
    return str(reply["status"]["token"])


def _pod(kube: APIServerEmulator, *, name: str, namespace: str, account: str) -> Obj:
    return kube.create_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeName": NODE,
                "serviceAccountName": account,
                "containers": [{"name": "c", "image": "dra-suite:test"}],
            },
        }
    )


@contextlib.asynccontextmanager
async def _auth_service(env: Mapping[str, str]) -> AsyncIterator[None]:
    service = AuthService(auth_cli.parse([], env))
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(service, grace_s=5, stop=stop, handle_signals=False))
    try:
        await asyncio.wait_for(service.subscribed.wait(), 15)
        await asyncio.wait_for(service.provisioner.done.wait(), 15)  # the streams, first
        yield
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0


async def _refused(url: str, **options: Any) -> None:
    client = nats.aio.client.Client()
    try:
        await client.connect(
            url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5, **options
        )
        await client.flush(timeout=8)
    except Exception:  # nats-py raises several unrelated types for a refusal
        return
    finally:
        await client.close()  # also releases the socket of a refused attempt
    raise AssertionError(f"{url} let the client in with {sorted(options)}")


async def test_the_rendered_bus_admits_its_agents_and_operator_and_nobody_else(
    tmp_path, monkeypatch
):
    # Without kubectl, the base: the sim overlay patches nothing the bus is made of.
    objects = render("overlays/sim") if KUBECTL is not None else _base()
    namespace = _one(objects, "StatefulSet", "nats")["metadata"]["namespace"]
    # The two Secrets of the install: keygen's, and a TLS one (here for 127.0.0.1).
    callout = _keygen_secret()
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    secrets = {
        callout["metadata"]["name"]: callout["stringData"],
        TLS_SECRET: {
            "tls.crt": server_cert.cert_chain_pems[0].bytes().decode(),
            "tls.key": server_cert.private_key_pem.bytes().decode(),
            "ca.crt": ca.cert_pem.bytes().decode(),
        },
        # Not Secrets: the ConfigMaps docs/install.md has an admin make from the two Secrets.
        AUTH_KEY_CONFIGMAP: {"certify.pub": callout["stringData"]["certify.pub"]},
        CA_CONFIGMAP: {"ca.crt": ca.cert_pem.bytes().decode()},
    }
    # nats-server: the rendered config and env, file paths local.
    nats_set = _one(objects, "StatefulSet", "nats")
    nats_files = _files_of(nats_set, secrets, tmp_path / "nats-pod")
    config = _one(objects, "ConfigMap", "nats-config")["data"]["nats.conf"]
    for pod_path, local in nats_files.items():
        config = config.replace(pod_path, local)
    config = config.replace('http: "127.0.0.1:8222"\n', "").replace("store_dir: /data\n", "")
    (tmp_path / "nats.conf").write_text(config)
    for entry in _container(nats_set)["env"]:
        ref = entry["valueFrom"]["secretKeyRef"]
        monkeypatch.setenv(entry["name"], secrets[ref["name"]][ref["key"]])
    server = NATSServerProcess(
        tmp_path / "store", extra_args=("--config", str(tmp_path / "nats.conf"))
    )
    server.start()
    url = f"tls://127.0.0.1:{server.port}"
    kube = APIServerEmulator(ClusterConfig.for_tests("1.36"))
    await kube.start()
    try:
        kube.create_object(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
        for account in _of_kind(objects, "ServiceAccount"):
            kube.create_object({k: account[k] for k in ("apiVersion", "kind", "metadata")})
        kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        kubeconfig = str(kube.write_kubeconfig(tmp_path / "kubeconfig"))
        # dra-nats-auth: the rendered Deployment's env.
        deployment = _one(objects, "Deployment", "dra-nats-auth")
        files = _files_of(deployment, secrets, tmp_path / "auth-pod")
        auth_env = {k: files.get(v, v) for k, v in _resolved_env(deployment).items()}
        auth_env |= {"NATS_URL": url, "KUBECONFIG": kubeconfig, "OPS_PORT": "0"}
        async with _auth_service(auth_env):
            for ds in _of_kind(objects, "DaemonSet"):
                agent = _container(ds)["name"]
                account = ds["spec"]["template"]["spec"]["serviceAccountName"]
                pod = _pod(kube, name=f"{account}-x", namespace=namespace, account=account)
                token_path, audience = _token_path(ds)
                token_file = tmp_path / f"{agent}.token"
                token_file.write_text(await _token(kube, pod=pod, audience=audience))
                files = _files_of(ds, secrets, tmp_path / f"{agent}-pod")
                files[token_path] = str(token_file)
                env = {k: files.get(v, v) for k, v in _resolved_env(ds).items()}
                env |= {"NATS_URL": url, "NODE_NAME": NODE}
                settings = CONFIG_BUILDERS[agent]([], env).nats
                assert settings.bus_signatures == signature_settings.ENFORCE, agent
                async with connected(settings, component=agent, node=NODE) as bus:
                    if agent == "discovery":  # its own inventory key: written and read back,
                        # signed with a certified key (enforce drops anything else)
                        key = bus.names.inventory_key(env["DRIVER_NAME"], NODE)
                        bucket = bus.names.inventory_bucket
                        await bus.kv_put(bucket, key, b"probe")
                        assert bus.records.writer is not None
                        assert bus.records.writer.usable(time.time()), "certified"
                        assert await bus.kv_get(bucket, key) == b"probe"
                # The same account's token for another audience is refused.
                other = await _token(kube, pod=pod, audience="https://kubernetes.default.svc")
                await _refused(url, tls=_ca_context(secrets), tls_handshake_first=True, token=other)
            # The operator identity the Deployment names.
            operator = _resolved_env(deployment)["OPERATOR_USERS"].rsplit(":", 1)[1]
            token = await _token_for_account(kube, namespace=namespace, account=operator)
            nc = await nats.connect(
                url,
                tls=_ca_context(secrets),
                tls_handshake_first=True,
                token=token,
                connect_timeout=5,
            )
            try:
                await nc.flush(timeout=8)
            finally:
                await nc.close()
            # A pod of another account, and anyone without TLS, are refused.
            default = {"name": "default", "namespace": namespace}  # what Kubernetes adds
            kube.create_object({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": default})
            stranger = _pod(kube, name="curl", namespace=namespace, account="default")
            token = await _token(kube, pod=stranger, audience=audience)
            await _refused(url, tls=_ca_context(secrets), tls_handshake_first=True, token=token)
            await _refused(url.replace("tls://", "nats://"), token=token)
    finally:
        await kube.stop()
        server.stop()


def _ca_context(secrets: Mapping[str, Mapping[str, str]]) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=secrets[TLS_SECRET]["ca.crt"])


async def _token_for_account(kube: APIServerEmulator, *, namespace: str, account: str) -> str:
    """`kubectl create token <account> --audience nats.dra-suite.io`: not bound to a pod."""
    spec = {"audiences": ["nats.dra-suite.io"], "expirationSeconds": 3600}
    url = f"{kube.url}/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as answer:
        reply = await answer.json()
        assert answer.status == 201, reply
    return str(reply["status"]["token"])
