"""The control plane's own PKI, made fresh for every start: a CA, kube-apiserver's serving
certificate, client certificates for the admin and each component, and the ServiceAccount
signing key (RSA, as kubeadm makes it, so tokens are RS256 and the JWKS is an RSA key).

Everything is written as PEM files into one directory; private keys are mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["ClientIdentity", "ControlPlanePKI", "write_pki"]

_VALIDITY = datetime.timedelta(days=2)
SERVICE_IP = "10.0.0.1"
"""The first address of the service range: the `kubernetes` Service's ClusterIP."""


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """A client certificate's subject: CN is the user, O the groups."""

    name: str
    user: str
    groups: tuple[str, ...] = ()


ADMIN = ClientIdentity("admin", "kubernetes-admin", ("system:masters",))
SCHEDULER = ClientIdentity("kube-scheduler", "system:kube-scheduler")
CONTROLLER_MANAGER = ClientIdentity("kube-controller-manager", "system:kube-controller-manager")
CLIENTS = (ADMIN, SCHEDULER, CONTROLLER_MANAGER)


@dataclass(frozen=True, slots=True)
class ControlPlanePKI:
    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_public_key(self) -> Path:
        return self.directory / "sa.pub"

    def client_cert(self, client: ClientIdentity) -> Path:
        return self.directory / f"{client.name}.crt"

    def client_key(self, client: ClientIdentity) -> Path:
        return self.directory / f"{client.name}.key"


def write_pki(directory: Path) -> ControlPlanePKI:
    """Make and write every key and certificate the control plane needs."""
    pki = ControlPlanePKI(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dra-suite-control-plane-ca")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_ca_usage(), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write_cert(pki.ca_cert, ca)
    serving_key = ec.generate_private_key(ec.SECP256R1())
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", SERVICE_IP)]
    serving = (
        _builder(_subject("kube-apiserver"), ca_name, serving_key.public_key())
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_cert(pki.serving_cert, serving)
    _write_key(pki.serving_key, serving_key)
    for client in CLIENTS:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            _builder(_subject(client.user, client.groups), ca_name, key.public_key())
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_cert(pki.client_cert(client), cert)
        _write_key(pki.client_key(client), key)
    signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account_key, signing_key)
    public = signing_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pki.service_account_public_key.write_bytes(public)
    return pki


def _subject(user: str, groups: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, user)])


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _ca_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.touch(mode=0o600)
    path.write_bytes(pem)
