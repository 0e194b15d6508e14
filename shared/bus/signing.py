"""Values that prove their writer: writer certificates and signed records. Pure.

Every agent process makes an ed25519 key pair at start and has `dra-nats-auth` certify its
public key for the bus identity it connected as: a certificate says (node, role, key,
not_before, not_after) and is signed by the auth service's own ed25519 key (the *auth key*,
an nkey `O...`; its seed `SO...` is `certify.seed` of the callout Secret). The agent asks over
`dra.auth.certify.<role>.<node>`, a subject nats-server lets only that identity publish; the
request carries a proof that the sender holds the private half.

A record (a KV put or delete, an alert) carries two headers: `Dra-Cert` (the certificate) and
`Dra-Sig`, an ed25519 signature by the certified key over the record's subject (bucket and
key, or the alert subject), the headers that change its meaning (`KV-Operation`, `Nats-TTL`,
`Nats-Msg-Id`), a digest of the certificate and the payload (which holds the generation). A
reader takes a record only when the signature checks, the certificate is the auth key's and
was valid when the server stored the record, and the certificate's role and node own the
subject (`Names.writer_of`). Everything here is bytes in, verdict out: no clock, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import nacl.exceptions
import nacl.signing

from shared.bus.subjects import Writer, token

__all__ = [
    "CERTIFIED_ROLES",
    "CERT_HEADER",
    "PROOF_HEADER",
    "REASONS",
    "SIGNED_HEADERS",
    "SIG_HEADER",
    "Certificate",
    "CertifyRequest",
    "Rejected",
    "Signer",
    "Verifier",
    "WriterKey",
    "certify_request",
    "issue_certificate",
    "read_certify_request",
    "record_message",
]

CERT_HEADER = "Dra-Cert"
SIG_HEADER = "Dra-Sig"
PROOF_HEADER = "Dra-Proof"
SIGNED_HEADERS = ("KV-Operation", "Nats-TTL", "Nats-Msg-Id")
"""Headers that change what a record means; signed with it (trace headers are not)."""
CERTIFIED_ROLES = ("discovery", "allocation", "health")
REASONS = (
    "unsigned",
    "empty",
    "malformed",
    "bad_certificate",
    "expired_certificate",
    "bad_signature",
    "wrong_owner",
)
"""Why a record was dropped: no signature (enforce); no data, no headers and no delete
operation (what a redirected 404/412 answer leaves; every mode but off); a header that does
not decode; a certificate not signed by the auth key or not for a writer role; a certificate
not valid when the record was stored; a signature that does not check; a certificate whose
node and role do not own the subject."""

CLOCK_SKEW_S = 120
"""Leeway between the auth service's clock and the NATS server's stored-at time."""
PROOF_MAX_AGE_S = 300
_RECORD_CONTEXT = b"dra-suite record v1\n"
_CERT_CONTEXT = b"dra-suite certificate v1\n"
_PROOF_CONTEXT = b"dra-suite certify v1\n"
_CERT_VERSION = "v1"
_KEY_BYTES = 32
_SIG_BYTES = 64
_MAX_CERT_LEN = 2048
# Parsed certificates a reader keeps: one per writer role (two per node) of the largest fleet
# one NATS account holds (about 7,000 nodes, docs/operations.md), so that a reader of the whole
# fleet (dractl --all-nodes, which meets each node's records in no order) checks each
# certificate once, not once per record (beyond it, checks stay right and cost more). About
# 0.7 KB each: at most 12 MB, and only a reader of every node's records gets near it.
_CACHE_SIZE = 16_384


class Rejected(ValueError):
    """A record, certificate or certify request that does not check; `reason` is in REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Signer(Protocol):
    """An ed25519 signer (the auth service's `keys.SigningKey`, or a `WriterKey`)."""

    def sign(self, data: bytes) -> bytes: ...


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str, *, what: str, reason: str = "malformed") -> bytes:
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise Rejected(reason, f"{what} is not base64url") from None


@dataclass(frozen=True, slots=True)
class Certificate:
    node: str
    role: str
    key: bytes
    """The writer's ed25519 public key, 32 bytes."""
    not_before: int
    not_after: int

    def body(self) -> bytes:
        fields = {"exp": self.not_after, "key": _b64(self.key), "nbf": self.not_before,
                  "node": self.node, "role": self.role}  # fmt: skip
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    def valid_at(self, when: float, *, skew_s: float = CLOCK_SKEW_S) -> bool:
        return self.not_before - skew_s <= when <= self.not_after + skew_s

    def owns(self, writer: Writer | None) -> bool:
        return writer is not None and (self.role, token(self.node)) == writer


def issue_certificate(cert: Certificate, *, auth: Signer) -> str:
    """The certificate as a header value: `v1.<body>.<auth signature>`."""
    body = cert.body()
    return f"{_CERT_VERSION}.{_b64(body)}.{_b64(auth.sign(_CERT_CONTEXT + body))}"


def _parse_certificate(text: str, *, auth_key: nacl.signing.VerifyKey) -> Certificate:
    if len(text) > _MAX_CERT_LEN:
        raise Rejected("bad_certificate", "certificate too long")
    version, _, rest = text.partition(".")
    encoded, _, signature = rest.partition(".")
    if version != _CERT_VERSION or not encoded or not signature:
        raise Rejected("bad_certificate", "not a v1 certificate")
    body = _unb64(encoded, what="certificate", reason="bad_certificate")
    try:
        auth_key.verify(_CERT_CONTEXT + body, _unb64(signature, what="certificate signature",
                                                     reason="bad_certificate"))  # fmt: skip
    except (nacl.exceptions.BadSignatureError, ValueError):
        raise Rejected("bad_certificate", "certificate not signed by the auth key") from None
    try:
        fields = json.loads(body)
        cert = Certificate(
            node=str(fields["node"]), role=str(fields["role"]),
            key=_unb64(str(fields["key"]), what="certified key", reason="bad_certificate"),
            not_before=int(fields["nbf"]), not_after=int(fields["exp"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError):
        raise Rejected("bad_certificate", "certificate body does not parse") from None
    if len(cert.key) != _KEY_BYTES or cert.role not in CERTIFIED_ROLES or not cert.node:
        raise Rejected("bad_certificate", "certificate of no writer")
    return cert


def record_message(
    subject: str, payload: bytes, headers: Mapping[str, str] | None, *, cert: str
) -> bytes:
    """The bytes a record's signature covers."""
    found = headers or {}
    meaning = "".join(f"{name}:{found.get(name, '')}\n" for name in SIGNED_HEADERS)
    digest = hashlib.sha256(cert.encode()).digest()
    return b"".join((_RECORD_CONTEXT, subject.encode(), b"\n", meaning.encode(), digest, payload))


class WriterKey:
    """This process's writer key pair; `certificate` once the auth service certified it."""

    def __init__(self, seed: bytes | None = None) -> None:
        self._key = nacl.signing.SigningKey(seed if seed is not None else os.urandom(32))
        self.public = bytes(self._key.verify_key)
        self.certificate = ""
        self.cert: Certificate | None = None

    def sign(self, data: bytes) -> bytes:
        return bytes(self._key.sign(data).signature)

    def install(self, text: str, *, auth_key: nacl.signing.VerifyKey, role: str, node: str,
                now: float) -> Certificate:  # fmt: skip
        """Take the auth service's answer: it must certify this key, for us, now."""
        cert = _parse_certificate(text, auth_key=auth_key)
        if cert.key != self.public or (cert.role, cert.node) != (role, node):
            raise Rejected("bad_certificate", "the certificate is not for this key and identity")
        if not cert.valid_at(now, skew_s=0):
            raise Rejected("expired_certificate", "the certificate is not valid now")
        self.certificate, self.cert = text, cert
        return cert

    def fresh(self, now: float) -> bool:
        """Certified, and less than half of the certificate's life has passed."""
        cert = self.cert
        return cert is not None and now < (cert.not_before + cert.not_after) / 2

    def usable(self, now: float) -> bool:
        cert = self.cert
        return cert is not None and cert.valid_at(now, skew_s=0)

    def headers(self, subject: str, payload: bytes, headers: Mapping[str, str]) -> dict[str, str]:
        """`headers` plus this writer's certificate and signature over the record."""
        if not self.certificate:
            raise ValueError("the writer key is not certified yet")
        message = record_message(subject, payload, headers, cert=self.certificate)
        return {**headers, CERT_HEADER: self.certificate, SIG_HEADER: _b64(self.sign(message))}

    def __repr__(self) -> str:
        return f"WriterKey({_b64(self.public)})"


class Verifier:
    """Checks records against the auth key; parsed certificates are kept (bounded)."""

    def __init__(self, auth_key: nacl.signing.VerifyKey) -> None:
        self.auth_key = auth_key
        self._certs: OrderedDict[str, Certificate] = OrderedDict()
        # A reader may check records on several threads (`reading.latest_values`).
        self._certs_lock = threading.Lock()

    @property
    def cached(self) -> int:
        """How many parsed certificates are kept."""
        return len(self._certs)

    def certificate(self, text: str) -> Certificate:
        with self._certs_lock:
            cached = self._certs.get(text)
            if cached is not None:
                self._certs.move_to_end(text)
                return cached
        cert = _parse_certificate(text, auth_key=self.auth_key)  # not under the lock: slow
        with self._certs_lock:
            self._certs[text] = cert
            if len(self._certs) > _CACHE_SIZE:
                self._certs.popitem(last=False)
        return cert

    def verify(
        self,
        subject: str,
        payload: bytes,
        headers: Mapping[str, str] | None,
        *,
        owner: Writer | None,
        stored_at: float,
    ) -> Certificate:
        """The writer's certificate of a signed record; raises `Rejected`. An unsigned record
        raises `Rejected("unsigned")` (or `"empty"`): whether to take it is the mode's call."""
        found = headers or {}
        cert_text, signature = found.get(CERT_HEADER), found.get(SIG_HEADER)
        if cert_text is None and signature is None:
            deleting = found.get("KV-Operation") in ("DEL", "PURGE")
            if not payload and not deleting:
                raise Rejected("empty", "no data, no signature and no delete operation")
            raise Rejected("unsigned", "no Dra-Cert/Dra-Sig headers")
        if not cert_text or not signature:
            raise Rejected("malformed", "a certificate without a signature or the reverse")
        cert = self.certificate(cert_text)
        if not cert.valid_at(stored_at):
            raise Rejected("expired_certificate", "the certificate was not valid when stored")
        if not cert.owns(owner):
            who = f"{cert.role}@{cert.node[:64]}"
            raise Rejected("wrong_owner", f"{who} does not own {subject[:200]}")
        raw = _unb64(signature, what="signature")
        if len(raw) != _SIG_BYTES:
            raise Rejected("malformed", "a signature is 64 bytes")
        message = record_message(subject, payload, found, cert=cert_text)
        try:
            nacl.signing.VerifyKey(cert.key).verify(message, raw)
        except nacl.exceptions.BadSignatureError:
            raise Rejected("bad_signature", "the signature does not check") from None
        return cert


# Certify requests: `dra.auth.certify.<role>.<node>` carries {"key", "role", "node", "at"}
# and the key's signature over it in `Dra-Proof`.


@dataclass(frozen=True, slots=True)
class CertifyRequest:
    key: bytes
    role: str
    node: str
    at: int


def certify_request(key: WriterKey, *, role: str, node: str, now: float) -> tuple[bytes, str]:
    """The body and `Dra-Proof` header of this key's certify request."""
    fields = {"at": int(now), "key": _b64(key.public), "node": node, "role": role}
    body = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return body, _b64(key.sign(_PROOF_CONTEXT + body))


def read_certify_request(
    body: bytes, proof: str, *, subject_writer: Writer, now: float
) -> CertifyRequest:
    """A request whose subject (`Names.certifier_of`) names the identity it asks for, signed by
    the key it presents, and recent; raises `Rejected`."""
    try:
        fields = json.loads(body)
        request = CertifyRequest(
            key=_unb64(str(fields["key"]), what="key"), role=str(fields["role"]),
            node=str(fields["node"]), at=int(fields["at"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError):
        raise Rejected("malformed", "not a certify request") from None
    if len(request.key) != _KEY_BYTES or request.role not in CERTIFIED_ROLES:
        raise Rejected("malformed", "no writer key or role")
    if (request.role, token(request.node)) != subject_writer or not request.node:
        raise Rejected("wrong_owner", "the request names another identity than its subject")
    if abs(now - request.at) > PROOF_MAX_AGE_S:
        raise Rejected("expired_certificate", "the request is not recent")
    try:
        nacl.signing.VerifyKey(request.key).verify(
            _PROOF_CONTEXT + body, _unb64(proof, what="proof")
        )
    except (nacl.exceptions.BadSignatureError, ValueError):
        raise Rejected("bad_signature", "the proof does not check") from None
    return request
