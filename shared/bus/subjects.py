"""Every NATS subject, KV bucket, KV key and stream name used by dra-suite, in one place.

Driver and node names are DNS subdomains, so their dots are mapped to `_` (never part of a
DNS name) to keep each name one subject token; the mapping is injective.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["Names", "Writer", "token"]

Writer = tuple[str, str]
"""Who alone may write a subject: (role, node as a subject token)."""

_MAX_OWNER_IN_NAME = 200


def token(name: str) -> str:
    """A DNS name as one subject token: `sim.dra-suite.io` -> `sim_dra-suite_io`."""
    return name.replace(".", "_")


_REPLY_BINDING = " reply-to "
"""Joins a request subject and its reply subject; a NATS subject never holds a space."""


@dataclass(frozen=True, slots=True)
class Names:
    """Names under an optional namespace prefix (tests give each suite its own)."""

    namespace: str = ""

    @property
    def _subject_prefix(self) -> str:
        return f"{self.namespace}." if self.namespace else ""

    @property
    def _bucket_prefix(self) -> str:
        return f"{self.namespace}_" if self.namespace else ""

    @property
    def inventory_bucket(self) -> str:
        return f"{self._bucket_prefix}dra_inventory"

    @property
    def health_bucket(self) -> str:
        return f"{self._bucket_prefix}dra_health"

    @property
    def claims_bucket(self) -> str:
        """Prepared claims per node (written by the allocation agent, read by health/dractl)."""
        return f"{self._bucket_prefix}dra_claims"

    @property
    def alerts_stream(self) -> str:
        return f"{self._bucket_prefix}DRA_ALERTS".replace("-", "_")

    @property
    def alerts_wildcard(self) -> str:
        return f"{self._subject_prefix}dra.alerts.>"

    def alerts(self, driver: str, node: str) -> str:
        return f"{self._subject_prefix}dra.alerts.{token(driver)}.{token(node)}"

    def fault_control(self, driver: str, node: str) -> str:
        """Request/reply subject for injecting faults into sim devices."""
        return f"{self._subject_prefix}dra.control.{token(driver)}.{token(node)}.fault"

    def drain_control(self, driver: str, node: str) -> str:
        """Request/reply subject for draining and undraining devices by hand (dractl)."""
        return f"{self._subject_prefix}dra.control.{token(driver)}.{token(node)}.drain"

    @staticmethod
    def inventory_key(driver: str, node: str) -> str:
        return f"{token(driver)}.{token(node)}"

    @staticmethod
    def health_key(driver: str, node: str, device: str) -> str:
        return f"{token(driver)}.{token(node)}.{device}"

    @staticmethod
    def health_keys(driver: str, node: str) -> str:
        """KV watch filter for all device health keys of one node."""
        return f"{token(driver)}.{token(node)}.*"

    @staticmethod
    def claim_key(driver: str, node: str, claim_uid: str) -> str:
        return f"{token(driver)}.{token(node)}.{claim_uid}"

    @staticmethod
    def claim_keys(driver: str, node: str) -> str:
        """KV watch filter for all prepared claims of one node."""
        return f"{token(driver)}.{token(node)}.*"

    # Inboxes and JetStream API subjects: what the NATS auth service grants, and what the Bus
    # uses, so that every permission is a subject an agent's own call really sends.

    def inbox_prefix(self, component: str, node: str = "") -> str:
        """Reply subjects of one identity: `_INBOX.<component>[.<node>]` (only it may subscribe)."""
        owner = f"{component}.{token(node)}" if node else component
        return f"{self._subject_prefix}_INBOX.{owner}"

    @property
    def control_wildcard(self) -> str:
        """Every control subject of every node (the operator's publish grant)."""
        return f"{self._subject_prefix}dra.control.*.*.>"

    def node_control(self, driver: str, node: str) -> str:
        """Every control subject of one node (fault, drain)."""
        return f"{self._subject_prefix}dra.control.{token(driver)}.{token(node)}.>"

    @staticmethod
    def kv_stream(bucket: str) -> str:
        return f"KV_{bucket}"

    @staticmethod
    def kv_subject(bucket: str, key: str) -> str:
        """The subject a KV put/delete of `key` is published on (`key` may be a filter)."""
        return f"$KV.{bucket}.{key}"

    @staticmethod
    def kv_followed(bucket: str, key: str) -> str:
        """Where the bucket's stream republishes what it stores on `key` (`key` may be a filter):
        node agents follow their keys there (`shared.bus.kvfollow`); only the server publishes."""
        return f"dra.kv.{bucket}.{key}"

    @staticmethod
    def js_leader_elected(stream: str) -> str:
        """JetStream's advisory that `stream` elected a leader."""
        return f"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{stream}"

    @staticmethod
    def js_stream_info(stream: str) -> str:
        return f"$JS.API.STREAM.INFO.{stream}"

    @staticmethod
    def js_stream_create(stream: str) -> str:
        return f"$JS.API.STREAM.CREATE.{stream}"

    @staticmethod
    def js_direct_get(bucket: str, key: str) -> str:
        """Direct get of the last value of `key`, the subject named in the API subject."""
        return f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{key}"

    @staticmethod
    def js_consumer_create(bucket: str, keys: str, *, consumer: str) -> str:
        """Creating the named consumer on `keys` of `bucket`: name and filter are in the subject."""
        return f"$JS.API.CONSUMER.CREATE.KV_{bucket}.{consumer}.$KV.{bucket}.{keys}"

    @staticmethod
    def js_consumer_delete(bucket: str, consumer: str) -> str:
        return f"$JS.API.CONSUMER.DELETE.KV_{bucket}.{consumer}"

    @staticmethod
    def consumer(role: str, owner: str, purpose: str) -> str:
        """The name of a watch's consumer that its owner alone may create (the quota auditor's:
        `auditor-<replica>-watch`); an owner too long for a consumer name (255 characters) is
        replaced by its digest."""
        name = token(owner)
        if len(name) > _MAX_OWNER_IN_NAME:
            name = "h" + hashlib.sha256(owner.encode()).hexdigest()[:40]
        return f"{role}-{name}-{purpose}"

    @staticmethod
    def js_consumer_info(bucket: str, consumer: str) -> str:
        return f"$JS.API.CONSUMER.INFO.KV_{bucket}.{consumer}"

    @property
    def buckets(self) -> tuple[str, ...]:
        return (self.inventory_bucket, self.health_bucket, self.claims_bucket)

    # Who writes what: the one identity whose grants (`services.natsauth.permissions`) let it
    # publish a subject, read back from the subject's layout. Readers check a record's signer
    # against it (`shared.bus.signing`).

    def writer_of(self, subject: str) -> Writer | None:
        """The (role, node token) that alone may write `subject`: a KV key of one of the
        buckets, a node's alert subject, or a reply to a node's control subject
        (`control_reply`); None for anything else."""
        prefix = self._subject_prefix
        request, bound, _ = subject.partition(_REPLY_BINDING)
        if bound:
            parts = request[len(prefix) :].split(".") if request.startswith(prefix) else []
            if len(parts) == 5 and parts[:2] == ["dra", "control"]:
                return "health", parts[3]
            return None
        tokens = subject.split(".")
        if len(tokens) >= 4 and tokens[0] == "$KV":
            bucket, key = tokens[1], tokens[2:]
            shape = {
                self.inventory_bucket: ("discovery", 2),
                self.health_bucket: ("health", 3),
                self.claims_bucket: ("allocation", 3),
            }.get(bucket)
            if shape is not None and len(key) == shape[1]:
                return shape[0], key[1]
            return None
        if subject.startswith(prefix):
            parts = subject[len(prefix) :].split(".")
            if len(parts) == 4 and parts[:2] == ["dra", "alerts"]:
                return "health", parts[3]
        return None

    @staticmethod
    def control_reply(request_subject: str, reply_subject: str) -> str:
        """What a control reply's signature covers in place of a subject: the request's subject
        (whose node's health agent alone may answer, `writer_of`) bound to the requester's
        one-off reply subject, so that a signed answer to one request answers no other."""
        return f"{request_subject}{_REPLY_BINDING}{reply_subject}"

    def certify(self, role: str, node: str) -> str:
        """Where a node agent asks the auth service to certify its writer key; only that
        identity may publish it."""
        return f"{self._subject_prefix}dra.auth.certify.{role}.{token(node)}"

    @property
    def certify_wildcard(self) -> str:
        return f"{self._subject_prefix}dra.auth.certify.*.*"

    def certifier_of(self, subject: str) -> Writer | None:
        """The (role, node token) a certify subject asks for."""
        prefix = f"{self._subject_prefix}dra.auth.certify."
        if not subject.startswith(prefix):
            return None
        parts = subject[len(prefix) :].split(".")
        return (parts[0], parts[1]) if len(parts) == 2 and all(parts) else None
