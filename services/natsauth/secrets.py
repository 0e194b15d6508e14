"""`dra-nats-auth keygen`: fresh Secret material for the callout, as a Kubernetes Secret.

Keys of Secret `dra-suite-nats-callout`: `issuer.seed`/`issuer.pub` (account nkey that signs
user JWTs; nats-server's `issuer` is the public half), `xkey.seed`/`xkey.pub` (curve key that
seals the callout traffic), `auth-password` (the service's own NATS user), `sys-password` (its
SYS-account user, which may only list connections and kick them: how a revoked node's live
connections end), `certify.seed`/`certify.pub` (operator nkey that certifies the agents' writer
keys; agents get the public half as `--bus-auth-key-file`). Pure, apart from the randomness.
"""

from __future__ import annotations

import secrets
import string

import nkeys  # type: ignore[import-untyped]  # ships no type hints
import yaml

from services.natsauth.keys import SigningKey, XKey, new_signing_seed, new_xkey_seed

__all__ = ["SECRET_NAME", "material", "password", "secret_manifest"]

SECRET_NAME = "dra-suite-nats-callout"


def material() -> dict[str, str]:
    """New issuer and xkey key pairs and a new password, by Secret key."""
    issuer_seed = new_signing_seed(nkeys.PREFIX_BYTE_ACCOUNT)
    xkey_seed = new_xkey_seed()
    certify_seed = new_signing_seed(nkeys.PREFIX_BYTE_OPERATOR)
    return {
        "issuer.seed": issuer_seed,
        "issuer.pub": SigningKey.from_seed(issuer_seed, nkeys.PREFIX_BYTE_ACCOUNT).public,
        "xkey.seed": xkey_seed,
        "xkey.pub": XKey.from_seed(xkey_seed).public,
        "auth-password": password(),
        "sys-password": password(),
        "certify.seed": certify_seed,
        "certify.pub": SigningKey.from_seed(certify_seed, nkeys.PREFIX_BYTE_OPERATOR).public,
    }


def password(length: int = 43) -> str:
    """A random password nats-server reads back as the string it is (about 256 bits).

    nats-server substitutes `$NATS_CALLOUT_AUTH_PASSWORD` and then parses the value as a
    config token: one starting with a digit is read as a number and fails the whole config
    ("Expected a digit"), and `-`, `_` or quotes could be read as syntax. So letters and
    digits only, and a letter first.
    """
    alphabet = string.ascii_letters + string.digits
    rest = "".join(secrets.choice(alphabet) for _ in range(length - 1))
    return secrets.choice(string.ascii_letters) + rest


def secret_manifest(values: dict[str, str], *, namespace: str) -> str:
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET_NAME, "namespace": namespace},
        "type": "Opaque",
        "stringData": values,
    }
    return yaml.safe_dump(manifest, sort_keys=False)
