"""The cert-manager Component: it makes exactly the Secret nats-server serves and the clients
trust (dra-suite-nats-tls, with ca.crt), for the names the clients dial, through a CA of the
bus's own; every overlay with it renders valid. cert-manager's CRDs are not vendored here, so
its objects are checked against the subset of cert-manager.io/v1 this Component uses."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.unit.deploy.manifests import (
    CA_FILE,
    KUBE_VERSIONS,
    KUBECTL,
    OVERLAYS,
    TLS_SECRET,
    _env,
    _of_kind,
    _resolved_env,
    is_kubernetes,
    render,
)

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")

COMPONENT = "components/cert-manager"
Obj = dict[str, Any]
USAGES = ("server auth", "client auth", "digital signature", "key encipherment", "cert sign")

_STRING = {"type": "string", "minLength": 1}
_ISSUER_REF = {
    "type": "object",
    "required": ["name", "kind"],
    "additionalProperties": False,
    "properties": {
        "name": _STRING,
        "kind": {"enum": ["Issuer", "ClusterIssuer"]},
        "group": _STRING,
    },
}
_META = {"type": "object", "required": ["name", "namespace"]}
# cert-manager.io/v1 (github.com/cert-manager/cert-manager, pkg/apis/certmanager/v1), the fields
# this Component writes; anything else is an error here.
SCHEMAS: dict[str, dict[str, Any]] = {
    "Issuer": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "metadata": _META,
            "spec": {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 1,
                "additionalProperties": False,
                "properties": {
                    "selfSigned": {"type": "object", "additionalProperties": False},
                    "ca": {
                        "type": "object",
                        "required": ["secretName"],
                        "additionalProperties": False,
                        "properties": {"secretName": _STRING},
                    },
                },
            },
        },
    },
    "Certificate": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "metadata": _META,
            "spec": {
                "type": "object",
                "required": ["secretName", "issuerRef"],
                "additionalProperties": False,
                "properties": {
                    "secretName": _STRING,
                    "issuerRef": _ISSUER_REF,
                    "isCA": {"type": "boolean"},
                    "commonName": {"type": "string", "maxLength": 64},
                    "duration": {"type": "string", "pattern": r"^\d+h$"},
                    "renewBefore": {"type": "string", "pattern": r"^\d+h$"},
                    "dnsNames": {"type": "array", "items": _STRING},
                    "ipAddresses": {"type": "array", "items": _STRING},
                    "usages": {
                        "type": "array",
                        "items": {"enum": list(USAGES)},
                    },
                    "privateKey": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                            "size": {"type": "integer"},
                            "rotationPolicy": {"enum": ["Never", "Always"]},
                        },
                    },
                },
            },
        },
    },
}


def _rendered(overlay: str = "sim") -> tuple[Obj, ...]:
    return render(f"overlays/{overlay}", (COMPONENT,))


def _cert_manager(objects: tuple[Obj, ...]) -> list[Obj]:
    return [o for o in objects if not is_kubernetes(o)]


def _hours(duration: str) -> int:
    return int(duration.removesuffix("h"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cert_manager_objects_use_only_known_fields(overlay):
    objects = _cert_manager(_rendered(overlay))
    assert sorted(o["kind"] for o in objects) == ["Certificate", "Certificate", "Issuer", "Issuer"]
    for obj in objects:
        jsonschema.validate(obj, SCHEMAS[obj["kind"]])


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_with_the_component_is_valid_kubernetes(overlay, version):
    for obj in _rendered(overlay):
        if is_kubernetes(obj):
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_server_certificate_is_the_secret_nats_serves_for_the_names_clients_dial():
    objects = _rendered()
    issuers = {o["metadata"]["name"]: o for o in _of_kind(objects, "Issuer")}
    certificates = {o["spec"]["secretName"]: o for o in _of_kind(objects, "Certificate")}
    (nats,) = [s for s in _of_kind(objects, "StatefulSet") if s["metadata"]["name"] == "nats"]
    served = {
        v["secret"]["secretName"]
        for v in nats["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert served == {TLS_SECRET}
    server = certificates[TLS_SECRET]
    namespace = nats["metadata"]["namespace"]
    assert {o["metadata"]["namespace"] for o in _cert_manager(objects)} == {namespace}
    assert not server["spec"].get("isCA", False)
    assert "server auth" in server["spec"]["usages"]
    dialled = {
        re.sub(r"^\w+://|:\d+$", "", _resolved_env(w)["NATS_URL"])
        for w in _of_kind(objects, "DaemonSet") + _of_kind(objects, "Deployment")
        if "NATS_URL" in _env(w)
    }
    assert dialled == {f"nats.{namespace}.svc"}
    # The Service in its short and long forms, the pod, and localhost for a port-forward.
    assert dialled | {f"nats.{namespace}.svc.cluster.local", "localhost"} <= set(
        server["spec"]["dnsNames"]
    )
    assert _hours(server["spec"]["renewBefore"]) < _hours(server["spec"]["duration"])
    # Its issuer is a CA whose certificate comes from a self-signed issuer: the chain the
    # clients' ca.crt (the same Secret, written by the CA issuer) closes.
    ca_issuer = issuers[server["spec"]["issuerRef"]["name"]]
    ca_certificate = certificates[ca_issuer["spec"]["ca"]["secretName"]]
    assert ca_certificate["spec"]["isCA"] is True
    root = issuers[ca_certificate["spec"]["issuerRef"]["name"]]
    assert root["spec"] == {"selfSigned": {}}
    assert CA_FILE.endswith("/ca.crt")
