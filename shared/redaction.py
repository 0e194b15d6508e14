"""Keep secrets out of logs and messages: secret-looking keys and URL userinfo are masked.

`redact_url` masks `user:password@` (and a token used as the user, `nats://token@host`) in
any text, wherever URLs appear in it. `redact` walks a log event: a value whose key looks like
a secret (password, token, secret, seed, credentials, ...) is replaced; a key naming a *file*
or *path* of a secret is kept, since a path is what an operator needs to fix a mount.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REDACTED", "is_secret_key", "redact", "redact_url"]

REDACTED = "[REDACTED]"

_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]+@")
_SECRET_WORDS = frozenset(
    {
        *("password", "passwd", "pass", "pwd", "passphrase"),
        *("token", "secret", "seed", "nkey", "jwt"),
        *("credential", "credentials", "creds", "authorization", "cookie"),
        *("apikey", "signature", "sig"),
    }
)
_SECRET_PHRASES = ("api_key", "private_key", "access_key", "secret_key")
# `password_file=/etc/...`: a path is no secret, and the operator needs it.
_LOCATION_WORDS = frozenset({"file", "path", "dir", "env", "flag"})


def redact_url(text: str) -> str:
    """`nats://user:pass@host` -> `nats://[REDACTED]@host`, for every URL in `text`."""
    if "@" not in text:
        return text
    return _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)


def is_secret_key(key: str) -> bool:
    normalized = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower().replace("-", "_")
    words = normalized.split("_")
    if words[-1] in _LOCATION_WORDS:
        return False
    return bool(_SECRET_WORDS.intersection(words)) or any(
        phrase in normalized for phrase in _SECRET_PHRASES
    )


def redact(value: Any, *, key: str = "") -> Any:
    """`value` with secrets masked: by its key, inside mappings and sequences, and in URLs."""
    if key and is_secret_key(key) and value not in (None, "", b""):
        return REDACTED
    if isinstance(value, str):
        return redact_url(value)
    if isinstance(value, Mapping):
        return {k: redact(v, key=str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(redact(item) for item in value)
    return value
