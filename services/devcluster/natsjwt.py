"""Mint NATS decentralized-auth JWTs for a dev or test server: one operator, one account, users.

What `nsc` does, in the small: ed25519 nkeys sign JWT v2 claims (`alg: ed25519-nkey`). The
account has unlimited JetStream, so a user of it can do everything the agents need. Users come
out as `.creds` files, the format `--nats-creds-file` reads.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import nkeys  # type: ignore[import-untyped]  # ships no type hints

from services.devcluster.natsauth import JWTTrust

__all__ = ["NKey", "Operator", "new_nkey"]

_UNLIMITED = -1


@dataclass(frozen=True, slots=True)
class NKey:
    seed: str
    public: str


def new_nkey(prefix: int) -> NKey:
    """A fresh key pair; `prefix` is one of nkeys.PREFIX_BYTE_{OPERATOR,ACCOUNT,USER}."""
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    keypair = nkeys.from_seed(bytearray(seed))
    public = bytes(keypair.public_key).decode()
    keypair.wipe()
    return NKey(seed=bytes(seed).decode(), public=public)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _encode(claims: dict[str, Any], signer: NKey) -> str:
    claims = {**claims, "iat": int(time.time()), "jti": ""}
    digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    signing_input = f"{header}.{_b64(json.dumps(claims).encode())}"
    keypair = nkeys.from_seed(bytearray(signer.seed.encode()))
    try:
        signature = bytes(keypair.sign(signing_input.encode()))
    finally:
        keypair.wipe()
    return f"{signing_input}.{_b64(signature)}"


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
