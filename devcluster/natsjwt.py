"""Mint NATS decentralized-auth JWTs for a dev or test server: one operator, one account, users.

What `nsc` does, in the small: ed25519 nkeys sign JWT v2 claims (`alg: ed25519-nkey`, framed
by PyJWT through `services.natsauth.nkeyjwt`). The account has unlimited JetStream, so a user
of it can do everything the agents need. Users come out as `.creds` files, the format
`--nats-creds-file` reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import nkeys  # type: ignore[import-untyped]  # ships no type hints

from devcluster.natsauth import JWTTrust
from services.natsauth import nkeyjwt
from services.natsauth.keys import SigningKey, new_signing_seed

__all__ = ["NKey", "Operator", "new_nkey"]

_UNLIMITED = -1


@dataclass(frozen=True, slots=True)
class NKey:
    seed: str
    public: str
    prefix: int
    """nkeys.PREFIX_BYTE_{OPERATOR,ACCOUNT,USER}."""


def new_nkey(prefix: int) -> NKey:
    """A fresh key pair; `prefix` is one of nkeys.PREFIX_BYTE_{OPERATOR,ACCOUNT,USER}."""
    seed = new_signing_seed(prefix)
    return NKey(seed=seed, public=SigningKey.from_seed(seed, prefix).public, prefix=prefix)


def _encode(claims: dict[str, Any], signer: NKey) -> str:
    body = {key: value for key, value in claims.items() if key != "iss"}  # the signer is `iss`
    return nkeyjwt.encode(body, signer=SigningKey.from_seed(signer.seed, signer.prefix))


class Operator:
    """An operator with one JetStream-enabled account; `trust` goes into the server config."""

    def __init__(self, name: str = "dra-dev") -> None:
        self.key = new_nkey(nkeys.PREFIX_BYTE_OPERATOR)
        self.account = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
        # JetStream needs a system account for its internal subscriptions.
        self.system_account = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
        self.jwt = _encode(
            {
                "iss": self.key.public,
                "sub": self.key.public,
                "name": name,
                "nats": {
                    "type": "operator",
                    "version": 2,
                    "system_account": self.system_account.public,
                },
            },
            self.key,
        )
        self.system_account_jwt = _encode(
            {
                "iss": self.key.public,
                "sub": self.system_account.public,
                "name": "SYS",
                "nats": {"type": "account", "version": 2},
            },
            self.key,
        )
        limits = dict.fromkeys(
            ("subs", "data", "payload", "imports", "exports", "conn", "leaf"), _UNLIMITED
        )
        limits |= dict.fromkeys(("mem_storage", "disk_storage", "streams", "consumer"), _UNLIMITED)
        self.account_jwt = _encode(
            {
                "iss": self.key.public,
                "sub": self.account.public,
                "name": f"{name}-agents",
                "nats": {
                    "limits": {**limits, "wildcards": True},
                    "default_permissions": {"pub": {}, "sub": {}},
                    "type": "account",
                    "version": 2,
                },
            },
            self.key,
        )

    @property
    def trust(self) -> JWTTrust:
        return JWTTrust(
            operator_jwt=self.jwt,
            system_account=self.system_account.public,
            account_jwts={
                self.account.public: self.account_jwt,
                self.system_account.public: self.system_account_jwt,
            },
        )

    def user_creds(self, name: str) -> str:
        """A `.creds` file's text for a new user of the account."""
        user = new_nkey(nkeys.PREFIX_BYTE_USER)
        jwt = _encode(
            {
                "iss": self.account.public,
                "sub": user.public,
                "name": name,
                "nats": {
                    "pub": {},
                    "sub": {},
                    **dict.fromkeys(("subs", "data", "payload"), _UNLIMITED),
                    "type": "user",
                    "version": 2,
                },
            },
            self.account,
        )
        return (
            "-----BEGIN NATS USER JWT-----\n"
            f"{jwt}\n"
            "------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            "-----BEGIN USER NKEY SEED-----\n"
            f"{user.seed}\n"
            "------END USER NKEY SEED------\n\n"
            "*************************************************************\n"
        )
