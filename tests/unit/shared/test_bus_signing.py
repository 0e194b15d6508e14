"""Signed records (issue 21): certificates, record signatures, who owns what, and the modes."""

from __future__ import annotations

import base64
from pathlib import Path

import nacl.signing
import nkeys  # type: ignore[import-untyped]  # ships no type hints
import pytest

from devcluster.certify import certified_writer
from services.natsauth import certifier, permissions
from services.natsauth.identity import Identity
from services.natsauth.keys import SigningKey, new_signing_seed
from shared import signature_settings
from shared.bus import signing
from shared.bus.records import Records
from shared.bus.subjects import Names
from shared.config import NATSSettings
from shared.errors import ConfigError

DRIVER = "sim.dra-suite.io"
N = Names("")
NOW = 1_800_000_000
AUTH = SigningKey.from_seed(
    new_signing_seed(nkeys.PREFIX_BYTE_OPERATOR), nkeys.PREFIX_BYTE_OPERATOR
)
INVENTORY_B = N.kv_subject(N.inventory_bucket, N.inventory_key(DRIVER, "node-b"))
HEALTH_B = N.kv_subject(N.health_bucket, N.health_key(DRIVER, "node-b", "gpu-0"))


def writer(
    role: str, node: str, *, auth: SigningKey = AUTH, lifetime_s: int = 3600
) -> signing.WriterKey:
    return certified_writer(
        auth, role=role, node=node, now=NOW, lifetime_s=lifetime_s, backdated_s=0
    )


def verifier(auth: SigningKey = AUTH) -> signing.Verifier:
    return signing.Verifier(signature_settings.decode_auth_key(auth.public))


def verify(
    subject: str, payload: bytes, headers: dict[str, str] | None, *, stored_at: float = NOW + 10
) -> signing.Certificate:
    return verifier().verify(
        subject, payload, headers, owner=N.writer_of(subject), stored_at=stored_at
    )


def reason(subject: str, payload: bytes, headers: dict[str, str] | None, **kw: float) -> str:
    with pytest.raises(signing.Rejected) as caught:
        verify(subject, payload, headers, **kw)
    return caught.value.reason


DISCOVERY_B = writer("discovery", "node-b")
SIGNED = DISCOVERY_B.headers(INVENTORY_B, b"inventory", {"traceparent": "00-x"})


def test_a_record_signed_by_its_keys_owner_verifies():
    cert = verify(INVENTORY_B, b"inventory", SIGNED)
    assert (cert.role, cert.node) == ("discovery", "node-b")
    deleted = DISCOVERY_B.headers(INVENTORY_B, b"", {"KV-Operation": "DEL", "Nats-TTL": "300s"})
    assert verify(INVENTORY_B, b"", deleted).node == "node-b"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"KV-Operation": "DEL"}, "bad_signature"),
        ({"Nats-TTL": "1s"}, "bad_signature"),
        ({"Nats-Msg-Id": "someone-elses"}, "bad_signature"),
        ({signing.SIG_HEADER: SIGNED[signing.SIG_HEADER][:-4] + "AAAA"}, "bad_signature"),
        ({signing.SIG_HEADER: "not base64!"}, "malformed"),
        ({signing.SIG_HEADER: "AAAA"}, "malformed"),
        (
            {signing.CERT_HEADER: SIGNED[signing.CERT_HEADER].replace(".", ".x", 1)},
            "bad_certificate",
        ),
        ({signing.CERT_HEADER: "v2.abc.def"}, "bad_certificate"),
        ({signing.CERT_HEADER: ""}, "malformed"),
    ],
    ids=[
        "delete added",
        "ttl",
        "msg id",
        "signature",
        "signature text",
        "signature length",
        "certificate body",
        "certificate version",
        "certificate gone",
    ],
)
def test_tampering_with_any_signed_header_is_refused(change: dict[str, str], why: str):
    assert reason(INVENTORY_B, b"inventory", {**SIGNED, **change}) == why


def test_tampering_with_payload_subject_or_trace_context():
    assert reason(INVENTORY_B, b"inventorY", SIGNED) == "bad_signature"
    other_key = N.kv_subject(N.inventory_bucket, N.inventory_key("other.io", "node-b"))
    assert reason(other_key, b"inventory", SIGNED) == "bad_signature"
    # Trace headers are not part of what a record means.
    assert verify(INVENTORY_B, b"inventory", {**SIGNED, "traceparent": "00-y"}).node == "node-b"


def test_a_certificate_swapped_for_another_of_the_same_identity_is_refused():
    other = writer("discovery", "node-b")
    swapped = {**SIGNED, signing.CERT_HEADER: other.certificate}
    assert reason(INVENTORY_B, b"inventory", swapped) == "bad_signature"


def test_another_nodes_certificate_on_a_key_is_refused():
    node_a = writer("discovery", "node-a")
    forged = node_a.headers(INVENTORY_B, b"inventory", {})
    assert reason(INVENTORY_B, b"inventory", forged) == "wrong_owner"
    # Another role of the right node: the health agent does not own the inventory key.
    health_b = writer("health", "node-b")
    assert reason(INVENTORY_B, b"x", health_b.headers(INVENTORY_B, b"x", {})) == "wrong_owner"
    assert verify(HEALTH_B, b"x", health_b.headers(HEALTH_B, b"x", {})).role == "health"
    # Something no node owns (another bucket, a control subject).
    other = "dra.control.sim_dra-suite_io.node-b.fault"
    assert reason(other, b"x", DISCOVERY_B.headers(other, b"x", {})) == "wrong_owner"


def test_a_certificate_counts_when_the_server_stored_the_record():
    skew = signing.CLOCK_SKEW_S
    assert verify(INVENTORY_B, b"inventory", SIGNED, stored_at=NOW + 3600 + skew).node
    late = NOW + 3600 + skew + 1
    assert reason(INVENTORY_B, b"inventory", SIGNED, stored_at=late) == "expired_certificate"
    early = NOW - skew - 1
    assert reason(INVENTORY_B, b"inventory", SIGNED, stored_at=early) == "expired_certificate"


def test_a_certificate_of_another_auth_key_is_refused():
    stranger = SigningKey.from_seed(
        new_signing_seed(nkeys.PREFIX_BYTE_OPERATOR), nkeys.PREFIX_BYTE_OPERATOR
    )
    forged = writer("discovery", "node-b", auth=stranger)
    headers = forged.headers(INVENTORY_B, b"inventory", {})
    assert reason(INVENTORY_B, b"inventory", headers) == "bad_certificate"
    assert (
        verifier(stranger)
        .verify(INVENTORY_B, b"inventory", headers, owner=N.writer_of(INVENTORY_B), stored_at=NOW)
        .node
    )


def test_unsigned_and_emptied_entries():
    assert reason(INVENTORY_B, b"value", None) == "unsigned"
    assert reason(INVENTORY_B, b"", {"KV-Operation": "DEL"}) == "unsigned"
    # What a redirected 404 or 412 answer leaves on the key: no headers, no data.
    assert reason(INVENTORY_B, b"", None) == "empty"
    assert reason(INVENTORY_B, b"", {}) == "empty"
    assert reason(INVENTORY_B, b"x", {signing.CERT_HEADER: SIGNED[signing.CERT_HEADER]}) == (
        "malformed"
    )


def test_a_writer_takes_only_a_certificate_for_its_own_key_and_identity():
    key = signing.WriterKey()
    auth_key = signature_settings.decode_auth_key(AUTH.public)
    for node, role, public in (
        ("node-a", "discovery", key.public),
        ("node-b", "health", key.public),
        ("node-b", "discovery", signing.WriterKey().public),
    ):
        cert = signing.Certificate(
            node=node, role=role, key=public, not_before=NOW, not_after=NOW + 60
        )
        with pytest.raises(signing.Rejected):
            key.install(
                signing.issue_certificate(cert, auth=AUTH),
                auth_key=auth_key,
                role="discovery",
                node="node-b",
                now=NOW,
            )
    assert not key.fresh(NOW)
    with pytest.raises(ValueError, match="not certified"):
        key.headers(INVENTORY_B, b"x", {})


def test_a_writer_renews_at_half_life():
    key = writer("discovery", "node-b", lifetime_s=1000)
    assert key.fresh(NOW + 499)
    assert not key.fresh(NOW + 500)
    assert key.usable(NOW + 999)
    assert not key.usable(NOW + 1001)


def test_every_subject_a_node_agent_may_write_is_owned_by_that_agent_alone():
    """`Names.writer_of` reads back what `permissions.for_identity` grants."""
    for role in signing.CERTIFIED_ROLES:
        grants = permissions.for_identity(
            Identity(role=role, node="gpu-7.rack-2"), drivers=[DRIVER], names=N
        )
        written = [s for s in grants.publish if s.startswith(("$KV.", "dra.alerts."))]
        assert written, role
        for subject in written:
            concrete = subject.replace("*", "dev-0")
            assert N.writer_of(concrete) == (role, "gpu-7_rack-2"), subject
    assert N.writer_of(N.alerts(DRIVER, "node-b")) == ("health", "node-b")
    assert N.writer_of(N.kv_subject(N.inventory_bucket, "a.b.c")) is None
    assert N.writer_of(N.kv_subject("other_bucket", "a.b")) is None
    assert N.writer_of(N.fault_control(DRIVER, "node-b")) is None
    prefixed = Names("t1")
    assert prefixed.writer_of(prefixed.alerts(DRIVER, "n")) == ("health", "n")
    assert prefixed.writer_of(N.alerts(DRIVER, "n")) is None


def test_only_the_identity_itself_may_ask_for_its_certificate():
    grants = permissions.for_identity(
        Identity(role="health", node="node-a"), drivers=[DRIVER], names=N
    )
    assert N.certify("health", "node-a") in grants.publish
    assert not [s for s in grants.publish if "certify" in s and "node-a" not in s]
    certifying = permissions.for_identity(
        Identity(role=permissions.CERTIFIER), drivers=[DRIVER], names=N
    )
    assert N.certify_wildcard in certifying.subscribe
    assert certifying.allow_responses
    assert certifying.publish == ("_INBOX.certifier.>",)


def test_the_certifier_answers_the_identity_of_the_subject_only():
    key = signing.WriterKey()
    body, proof = signing.certify_request(key, role="health", node="gpu-7.rack-2", now=NOW)
    subject = N.certify("health", "gpu-7.rack-2")
    answer, cert = certifier.answer(
        N.certifier_of(subject), body, proof, signer=AUTH, lifetime_s=600, now=NOW
    )
    assert cert is not None
    installed = key.install(
        answer["certificate"],
        auth_key=signature_settings.decode_auth_key(AUTH.public),
        role="health",
        node="gpu-7.rack-2",
        now=NOW,
    )
    assert installed.not_after == NOW + 600
    refusals = {
        "another node's subject": (N.certifier_of(N.certify("health", "node-b")), body, proof, NOW),
        "another role's subject": (
            N.certifier_of(N.certify("discovery", "gpu-7.rack-2")),
            body,
            proof,
            NOW,
        ),
        "not a certify subject": (N.certifier_of("dra.alerts.x.y"), body, proof, NOW),
        "another key's proof": (
            N.certifier_of(subject),
            body,
            signing.certify_request(
                signing.WriterKey(), role="health", node="gpu-7.rack-2", now=NOW
            )[1],
            NOW,
        ),
        "a stale request": (N.certifier_of(subject), body, proof, NOW + 301),
        "junk": (N.certifier_of(subject), b"{}", proof, NOW),
    }
    for what, (who, data, signature, now) in refusals.items():
        answer, cert = certifier.answer(who, data, signature, signer=AUTH, lifetime_s=600, now=now)
        assert cert is None, what
        assert "error" in answer, what


def test_the_auth_key_is_an_operator_nkey():
    assert AUTH.public.startswith("O")
    key = signature_settings.decode_auth_key(AUTH.public)
    assert signature_settings.encode_auth_key(bytes(key)) == AUTH.public
    account = SigningKey.from_seed(
        new_signing_seed(nkeys.PREFIX_BYTE_ACCOUNT), nkeys.PREFIX_BYTE_ACCOUNT
    )
    with pytest.raises(ValueError, match="operator"):
        signature_settings.decode_auth_key(account.public)
    with pytest.raises(ValueError, match="checksum"):
        signature_settings.decode_auth_key(
            AUTH.public[:-1] + ("A" if AUTH.public[-1] != "A" else "B")
        )


def _settings(tmp_path: Path, mode: str) -> NATSSettings:
    path = tmp_path / "certify.pub"
    path.write_text(AUTH.public + "\n")
    return NATSSettings(bus_signatures=mode, bus_auth_key_file=str(path))


def test_the_setting_needs_an_auth_key_unless_off(tmp_path: Path):
    assert NATSSettings().bus_signatures == "off"
    with pytest.raises(ConfigError, match="needs --bus-auth-key-file"):
        NATSSettings(bus_signatures="enforce")
    with pytest.raises(ConfigError, match="not one of"):
        NATSSettings(bus_signatures="on")
    bad = tmp_path / "bad.pub"
    bad.write_text("nonsense\n")
    with pytest.raises(ConfigError, match="bus auth key file"):
        NATSSettings(bus_signatures="accept", bus_auth_key_file=str(bad))
    assert _settings(tmp_path, "accept").auth_key() is not None


@pytest.mark.parametrize(
    ("mode", "taken"),
    [
        ("off", {"signed", "unsigned", "empty", "wrong node"}),
        ("accept", {"signed", "unsigned"}),
        ("enforce", {"signed"}),
    ],
)
def test_what_each_mode_takes(tmp_path: Path, mode: str, taken: set[str]):
    records = Records(
        _settings(tmp_path, mode) if mode != "off" else NATSSettings(),
        names=N,
        role="allocation",
        node="node-b",
        clock=lambda: NOW,
    )
    node_a = writer("discovery", "node-a")
    entries = {
        "signed": (b"inventory", SIGNED),
        "unsigned": (b"inventory", None),
        "empty": (b"", None),
        "wrong node": (b"inventory", node_a.headers(INVENTORY_B, b"inventory", {})),
    }
    outcome = {
        what: records.check(INVENTORY_B, data, headers, stored_at=NOW + 1)
        for what, (data, headers) in entries.items()
    }
    assert {what for what, check in outcome.items() if check.ok} == taken
    if mode != "off":
        assert outcome["signed"].writer is not None
        assert outcome["empty"].reason == "empty"
        assert outcome["wrong node"].reason == "wrong_owner"


def test_only_a_node_agent_signs_and_its_alert_ids_are_its_own(tmp_path: Path):
    settings = _settings(tmp_path, "enforce")
    health = Records(settings, names=N, role="health", node="node-b")
    again = Records(settings, names=N, role="health", node="node-b")
    assert health.writer is not None
    assert health.owns(N.alerts(DRIVER, "node-b"))
    assert not health.owns(N.alerts(DRIVER, "node-a"))
    assert Records(settings, names=N, role="operator", node="").writer is None
    assert Records(NATSSettings(), names=N, role="health", node="node-b").writer is None
    alert_id = "0123456789abcdef"
    assert health.msg_id(alert_id) == health.msg_id(alert_id)  # a retry is deduplicated
    assert health.msg_id(alert_id).startswith("node-b.")
    assert health.msg_id(alert_id) != again.msg_id(alert_id)  # nobody else can compute it
    assert Records(NATSSettings(), names=N, role="health", node="n").msg_id(alert_id) == alert_id


def test_signing_keys_are_ed25519():
    key = signing.WriterKey(seed=b"\x01" * 32)
    message = b"hello"
    nacl.signing.VerifyKey(key.public).verify(message, key.sign(message))
    assert base64.urlsafe_b64decode(SIGNED[signing.SIG_HEADER] + "==")


def test_an_owner_signs_its_own_unsigned_records_once(tmp_path: Path):
    """Accept mode, a rollout: what this agent wrote before it signed is signed again, once per
    key (an older writer of the key still running must not start a ping-pong)."""
    records = Records(_settings(tmp_path, "accept"), names=N, role="discovery", node="node-b")
    assert records.resign(INVENTORY_B)
    assert not records.resign(INVENTORY_B)
    assert not records.resign(N.kv_subject(N.inventory_bucket, N.inventory_key(DRIVER, "node-a")))
    assert not records.resign(HEALTH_B)  # not the discovery agent's


def test_keygen_makes_the_certify_key_and_the_service_reads_it(tmp_path: Path):
    from services.natsauth import secrets
    from services.natsauth.config import AuthServiceConfig

    material = secrets.material()
    seed, public = material["certify.seed"], material["certify.pub"]
    assert SigningKey.from_seed(seed, nkeys.PREFIX_BYTE_OPERATOR).public == public
    assert bytes(signature_settings.decode_auth_key(public))  # what the agents read
    (tmp_path / "issuer.seed").write_text(material["issuer.seed"])
    (tmp_path / "certify.seed").write_text(seed)
    config = AuthServiceConfig(
        issuer_seed_file=str(tmp_path / "issuer.seed"),
        certify_seed_file=str(tmp_path / "certify.seed"),
    )
    key = config.certify_key()
    assert key is not None
    assert key.public == public
    with pytest.raises(ConfigError, match="operator seed"):
        AuthServiceConfig(
            issuer_seed_file=str(tmp_path / "issuer.seed"),
            certify_seed_file=str(tmp_path / "issuer.seed"),
        )
    with pytest.raises(ConfigError, match="certificate-s"):
        AuthServiceConfig(issuer_seed_file=str(tmp_path / "issuer.seed"), certificate_s=10)


def test_a_control_reply_is_owned_by_the_health_agent_of_the_node_asked():
    inbox = "_INBOX.operator.x1.y2"
    drain_b = N.control_reply(N.drain_control(DRIVER, "node-b"), inbox)
    fault_b = N.control_reply(N.fault_control(DRIVER, "node-b"), inbox)
    assert N.writer_of(drain_b) == N.writer_of(fault_b) == ("health", "node-b")
    # Only a control subject binds an owner; a KV subject bound to an inbox is no record.
    assert N.writer_of(N.control_reply(INVENTORY_B, inbox)) is None
    assert N.writer_of(N.control_reply("dra.control.x.node-b", inbox)) is None
    signed = writer("health", "node-b").headers(drain_b, b"{}", {})
    assert verify(drain_b, b"{}", signed).node == "node-b"
    with pytest.raises(signing.Rejected, match="signature does not check"):
        verify(N.control_reply(N.drain_control(DRIVER, "node-b"), inbox + "z"), b"{}", signed)
    from_a = writer("health", "node-a").headers(drain_b, b"{}", {})
    with pytest.raises(signing.Rejected, match="does not own"):
        verify(drain_b, b"{}", from_a)


def test_a_reader_of_a_whole_fleet_checks_each_certificate_once():
    """Records of 1,500 nodes met in no order of node (as dractl --all-nodes meets them): every
    writer's certificate stays parsed, so a record costs one signature check, not two."""
    nodes = [f"node-{index:04d}" for index in range(1500)]
    records = []
    for node in nodes:
        key = writer("health", node)
        subject = N.kv_subject(N.health_bucket, N.health_key(DRIVER, node, "gpu-0"))
        records.append((subject, key.headers(subject, b"health", {})))
    reader = verifier()
    for _ in range(2):
        for subject, headers in records:
            owner = N.writer_of(subject)
            assert reader.verify(subject, b"health", headers, owner=owner, stored_at=NOW + 10)
    assert reader.cached == len(nodes)
