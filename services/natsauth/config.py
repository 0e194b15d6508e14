"""AuthServiceConfig: what the NATS auth callout service is told at start, checked before any I/O.

The shared groups (NATS connection of the service's own user, kube client, logs, ops port)
plus who may connect as what. The issuer seed signs every user JWT; the xkey seed, when set,
opens the server's sealed requests and seals our answers; the certify seed, when set, signs
the agents' writer certificates (`certifier`). Invalid values raise ConfigError.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import nkeys  # type: ignore[import-untyped]  # ships no type hints

from services.natsauth.keys import NKeyError, SigningKey, XKey
from shared import nats_auth
from shared.config import KubeSettings, LogSettings, NATSSettings, OpsSettings, setting
from shared.errors import ConfigError

__all__ = ["AuthServiceConfig"]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ACCOUNT = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthServiceConfig:
    nats: NATSSettings = field(default_factory=NATSSettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    log: LogSettings = field(default_factory=LogSettings)
    ops: OpsSettings = field(default_factory=OpsSettings)

    issuer_seed_file: str = setting(
        "", flag="--issuer-seed-file", help="Issuer account nkey seed (SA...) that signs user JWTs."
    )
    """The `issuer` of nats-server's auth_callout block is this seed's public key."""

    xkey_seed_file: str = setting(
        "", flag="--xkey-seed-file", help="Curve xkey seed (SX...) for sealed callout requests."
    )
    """Empty: the server sends requests in the clear (give `xkey` in its config to seal them)."""

    audience: str = setting(
        "nats.dra-suite.io", flag="--audience", help="Audience the clients' tokens must carry."
    )
    """Projected ServiceAccount tokens for NATS are minted for this audience only."""

    target_account: str = setting(
        "DRA", flag="--target-account", help="NATS account the admitted clients are placed in."
    )
    """The config-mode account holding the buckets and the alert stream."""

    agent_namespace: str = setting(
        "dra-suite", flag="--agent-namespace", help="Namespace of the agents' ServiceAccounts."
    )
    """Only dra-discovery/dra-allocation/dra-health of this namespace are node agents."""

    operator_users: tuple[str, ...] = setting(
        (), flag="--operator-users", help="Comma list of Kubernetes users who are operators."
    )
    """Users (as TokenReview names them) admitted with the operator role."""

    operator_groups: tuple[str, ...] = setting(
        ("dra-suite:operators",),
        flag="--operator-groups",
        help="Comma list of Kubernetes groups whose members are operators.",
    )
    """Groups whose members are admitted with the operator role."""

    driver_name: tuple[str, ...] = setting(
        ("sim.dra-suite.io",), flag="--driver-name", help="Comma list of drivers agents act for."
    )
    """A node agent is granted its node's subjects under each of these drivers."""

    max_session_s: int = setting(
        3600, flag="--max-session-s", help="Longest a NATS session lasts before a new review."
    )
    """A user JWT expires at the earlier of its token's expiry and this many seconds."""

    review_cache_s: float = setting(
        60.0, flag="--review-cache-s", help="How long a TokenReview answer is reused (0: never)."
    )
    """A deleted pod or ServiceAccount is noticed at the first connect after this."""

    review_cache_size: int = setting(
        20_000, flag="--review-cache-size", help="Most TokenReview answers kept."
    )
    """About 4 per node (3 agents and a spare) at 5,000 nodes."""

    reviews_per_source: float = setting(
        20.0, flag="--reviews-per-source", help="TokenReviews per second one address may cost."
    )
    """Refill rate of a source's bucket; 0 turns the limit off."""

    review_burst: float = setting(
        100.0, flag="--review-burst", help="TokenReviews one client address may cost at once."
    )
    """A node's three agents reconnecting together, many times over."""

    refusals_answered_per_s: float = setting(
        20.0,
        flag="--refusals-answered-per-s",
        help="Refusals of junk tokens answered per second; nats-server refuses the rest when "
        "its auth timeout passes (0: answer every one).",
    )
    """Under a junk flood, an answer costs signing and gives the attacker its next try sooner;
    a client refused unanswered waits the server's auth timeout (2 s), nothing else."""

    sys_user: str = setting(
        "dra-nats-auth-sys", flag="--sys-user", help="NATS user of the SYS account (connz, kick)."
    )
    """With `sys_password_file`: how a revoked node's live connections are ended."""

    sys_password_file: str = setting(
        "", flag="--sys-password-file", help="Password file of --sys-user; empty: no kicks."
    )
    """Empty: a revoked node is refused at its next connect, but its sessions run out."""

    revocations_configmap: str = setting(
        "dra-nats-auth-revocations",
        flag="--revocations-configmap",
        help="ConfigMap (in --agent-namespace) listing revoked nodes.",
    )
    """Written by `dra-nats-auth revoke-node`; a missing ConfigMap revokes nobody."""

    revocation_poll_s: float = setting(
        2.0, flag="--revocation-poll-s", help="How often the revocation list is read."
    )
    """A revocation is in force at every replica within this, and live connections end."""
    certify_seed_file: str = setting(
        "",
        flag="--certify-seed-file",
        help="Operator nkey seed (SO...) that certifies the agents' writer keys for signed "
        "records (`certify.seed` of the callout Secret); empty: no certificates.",
    )
    certificate_s: int = setting(
        21600,
        flag="--certificate-s",
        help="How long a writer certificate is valid; agents renew it at half its life.",
    )

    def __post_init__(self) -> None:
        if not self.issuer_seed_file:
            raise ConfigError("--issuer-seed-file is required", field="issuer_seed_file")
        self.issuer()
        if self.xkey_seed_file:
            self.xkey()
        if not self.audience:
            raise ConfigError("--audience must not be empty", field="audience")
        if not _ACCOUNT.match(self.target_account):
            raise ConfigError(
                f"target account {self.target_account!r} is not an account name",
                field="target_account",
            )
        if not _DNS_SUBDOMAIN.match(self.agent_namespace):
            raise ConfigError("--agent-namespace is not a namespace name", field="agent_namespace")
        if self.max_session_s < 60:
            raise ConfigError("--max-session-s must be at least 60", field="max_session_s")
        if self.review_cache_s < 0 or self.review_cache_size < 0:
            raise ConfigError("the review cache's size and time must not be negative",
                              field="review_cache_s")  # fmt: skip
        if self.reviews_per_source < 0 or self.review_burst < 1:
            raise ConfigError("--reviews-per-source >= 0 and --review-burst >= 1",
                              field="reviews_per_source")  # fmt: skip
        if self.refusals_answered_per_s < 0:
            raise ConfigError("--refusals-answered-per-s must not be negative",
                              field="refusals_answered_per_s")  # fmt: skip
        if not _DNS_SUBDOMAIN.match(self.revocations_configmap):
            raise ConfigError("--revocations-configmap is not a ConfigMap name",
                              field="revocations_configmap")  # fmt: skip
        if not 0.1 <= self.revocation_poll_s <= 60:
            raise ConfigError("--revocation-poll-s must be within 0.1..60",
                              field="revocation_poll_s")  # fmt: skip
        if self.sys_password_file:
            self.sys_nats()
        if self.certify_seed_file:
            self.certify_key()
        if not 300 <= self.certificate_s <= 7 * 86400:
            raise ConfigError("--certificate-s must be within 300..604800", field="certificate_s")
        if not self.driver_name:
            raise ConfigError("--driver-name needs at least one driver", field="driver_name")
        for driver in self.driver_name:
            if not _DNS_SUBDOMAIN.match(driver):
                raise ConfigError(f"driver name {driver!r} is not a DNS name", field="driver_name")

    def issuer(self) -> SigningKey:
        """The issuer account key, read from its file now (a rotated Secret needs a restart)."""
        return _seed_key(
            self.issuer_seed_file, field="issuer_seed_file", kind="an account seed (SA...)",
            load=lambda seed: SigningKey.from_seed(seed, nkeys.PREFIX_BYTE_ACCOUNT),
        )  # fmt: skip

    def certify_key(self) -> SigningKey | None:
        """The key that signs writer certificates, read from its file now; None when unset."""
        if not self.certify_seed_file:
            return None
        return _seed_key(
            self.certify_seed_file, field="certify_seed_file", kind="an operator seed (SO...)",
            load=lambda seed: SigningKey.from_seed(seed, nkeys.PREFIX_BYTE_OPERATOR),
        )  # fmt: skip

    def sys_nats(self) -> NATSSettings | None:
        """The SYS user's connection: the service's own server and TLS, another user."""
        if not self.sys_password_file:
            return None
        nats_auth.read_secret(self.sys_password_file, what="sys password file")
        return dataclasses.replace(
            self.nats, user=self.sys_user, password="", password_file=self.sys_password_file,
            token="", token_file="", nkey_seed_file="", creds_file="",
        )  # fmt: skip

    def xkey(self) -> XKey | None:
        if not self.xkey_seed_file:
            return None
        return _seed_key(
            self.xkey_seed_file, field="xkey_seed_file", kind="a curve seed (SX...)",
            load=XKey.from_seed,
        )  # fmt: skip


_Key = TypeVar("_Key")


def _seed_key(path: str, *, field: str, kind: str, load: Callable[[str], _Key]) -> _Key:
    """The key whose seed `path` holds, read now; ConfigError naming the file otherwise."""
    what = field.removesuffix("_file").replace("_", " ") + " file"
    seed = nats_auth.read_secret(path, what=what)
    try:
        return load(seed)
    except NKeyError as exc:
        raise ConfigError(f"{what} {path}: not {kind}: {exc}", field=field) from None
