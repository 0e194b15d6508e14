"""NATS credentials and TLS: checked when settings are built, turned into `nats.connect` options.

With TLS configured the handshake comes first (`tls_handshake_first`; the server's `tls` block
says `handshake_first: true`), so no credential leaves before the peer proved the certificate.

Secret files (a Kubernetes Secret mounted as files) are the way to hand secrets to an agent:
passwords, tokens and `.creds` files are read again at every (re)connect, so a rotated Secret is
picked up by the next reconnect; an nkey seed is read once per Bus. No error raised here holds
a secret: messages name the file and what is wrong with it, never its content.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import nats.errors
import nkeys  # type: ignore[import-untyped]  # ships no type hints

from shared.errors import ConfigError

__all__ = [
    "AuthSettings",
    "CredentialsUnreadableError",
    "auth_method",
    "check",
    "connect_options",
    "read_secret",
    "url_has_userinfo",
]

_JWT_MARKER = "BEGIN NATS USER JWT"
_SEED_MARKER = "BEGIN USER NKEY SEED"


class AuthSettings(Protocol):
    """The fields of `shared.config.NATSSettings` this module reads."""

    @property
    def url(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def password(self) -> str: ...
    @property
    def password_file(self) -> str: ...
    @property
    def token(self) -> str: ...
    @property
    def token_file(self) -> str: ...
    @property
    def nkey_seed_file(self) -> str: ...
    @property
    def creds_file(self) -> str: ...
    @property
    def tls_ca_file(self) -> str: ...
    @property
    def tls_cert_file(self) -> str: ...
    @property
    def tls_key_file(self) -> str: ...


class CredentialsUnreadableError(nats.errors.Error):
    """A secret file went bad between connects; nats-py reports it and tries again."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def url_has_userinfo(url: str) -> bool:
    """True when any of the comma-separated URLs carries `user[:password]@`."""
    for server in url.split(","):
        _, sep, rest = server.strip().partition("://")
        if sep and "@" in rest.split("/", 1)[0]:
            return True
    return False


def auth_method(settings: AuthSettings) -> str:
    """How the Bus authenticates, for logs: none, password, token, nkey, creds or url."""
    if settings.creds_file:
        return "creds"
    if settings.nkey_seed_file:
        return "nkey"
    if settings.token or settings.token_file:
        return "token"
    if settings.user:
        return "password"
    if url_has_userinfo(settings.url):
        return "url"
    return "none"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


def read_secret(path: str, *, what: str) -> str:
    """The stripped content of a secret file (a trailing newline is usual in Secrets)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} {path}: cannot read: {_reason(exc)}") from None
    secret = text.strip()
    if not secret:
        raise ConfigError(f"{what} {path} is empty")
    return secret


def _user_keypair(seed: str, *, what: str, path: str) -> Any:
    try:
        keypair = nkeys.from_seed(bytearray(seed.encode()))
        public = bytes(keypair.public_key)
    except (nkeys.NkeysError, ValueError):
        raise ConfigError(f"{what} {path} does not hold a valid nkey seed") from None
    if not public.startswith(b"U"):
        keypair.wipe()
        raise ConfigError(f"{what} {path} holds an nkey seed that is not a user's (SU...)")
    return keypair


def _nkey_seed(path: str) -> str:
    what = "nats nkey seed file"
    seed = read_secret(path, what=what)
    _user_keypair(seed, what=what, path=path).wipe()
    return seed


def _block_after(lines: list[str], marker: str) -> str:
    for index, line in enumerate(lines):
        if marker in line:
            following = lines[index + 1 : index + 2]
            return following[0].strip() if following else ""
    return ""


def _read_creds(path: str) -> tuple[str, str]:
    """The user JWT and nkey seed of a `.creds` file (as `nsc` writes it)."""
    what = "nats credentials file"
    lines = read_secret(path, what=what).splitlines()
    jwt, seed = _block_after(lines, _JWT_MARKER), _block_after(lines, _SEED_MARKER)
    if not jwt or not seed:
        raise ConfigError(f"{what} {path} lacks the user JWT or the user nkey seed block")
    _user_keypair(seed, what=what, path=path).wipe()
    return jwt, seed


def _tls_context(settings: AuthSettings) -> ssl.SSLContext:
    ca = settings.tls_ca_file
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"nats tls ca file {ca}: cannot load: {_reason(exc)}", field="tls_ca_file"
        ) from None
    if settings.tls_cert_file:
        try:
            # A key that needs a passphrase fails here instead of prompting on a terminal.
            context.load_cert_chain(
                settings.tls_cert_file, settings.tls_key_file, password=_no_passphrase
            )
        except (OSError, ssl.SSLError, _PassphraseNeededError) as exc:
            raise ConfigError(
                f"nats tls client certificate {settings.tls_cert_file} with key "
                f"{settings.tls_key_file}: cannot load: {_reason(exc)}",
                field="tls_cert_file",
            ) from None
    return context


class _PassphraseNeededError(Exception):
    pass


def _no_passphrase() -> str:
    raise _PassphraseNeededError("the key is encrypted; give an unencrypted key")


def _wants_tls(settings: AuthSettings) -> bool:
    schemes = {server.strip().partition("://")[0] for server in settings.url.split(",")}
    return bool(settings.tls_ca_file or settings.tls_cert_file or schemes & {"tls", "wss"})


def check(settings: AuthSettings) -> None:
    """Read every file the settings name and check its content; raises ConfigError."""
    if settings.password_file:
        read_secret(settings.password_file, what="nats password file")
    if settings.token_file:
        read_secret(settings.token_file, what="nats token file")
    if settings.nkey_seed_file:
        _nkey_seed(settings.nkey_seed_file)
    if settings.creds_file:
        _read_creds(settings.creds_file)
    if _wants_tls(settings):
        _tls_context(settings)


def _rereading(path: str, *, what: str) -> Callable[[], str]:
    def read() -> str:
        try:
            return read_secret(path, what=what)
        except ConfigError as exc:
            raise CredentialsUnreadableError(str(exc)) from None

    return read


def _creds_callbacks(path: str) -> dict[str, Any]:
    def creds() -> tuple[str, str]:
        try:
            return _read_creds(path)
        except ConfigError as exc:
            raise CredentialsUnreadableError(str(exc)) from None

    def user_jwt() -> bytes:
        return creds()[0].encode()

    def signature(nonce: str) -> bytes:
        try:
            keypair = _user_keypair(creds()[1], what="nats credentials file", path=path)
        except ConfigError as exc:
            raise CredentialsUnreadableError(str(exc)) from None
        try:
            return base64.b64encode(keypair.sign(nonce.encode()))
        finally:
            keypair.wipe()

    return {"user_jwt_cb": user_jwt, "signature_cb": signature}


def connect_options(settings: AuthSettings) -> dict[str, Any]:
    """The `nats.connect` keyword arguments for the settings' credentials and TLS.

    Raises ConfigError when a file is unusable at this moment (the Bus retries later).
    """
    options: dict[str, Any] = {}
    if settings.user:
        password: str | Callable[[], str] = settings.password
        if settings.password_file:
            read_secret(settings.password_file, what="nats password file")  # fail now
            password = _rereading(settings.password_file, what="nats password file")
        options.update(user=settings.user, password=password)
    if settings.token:
        options["token"] = settings.token
    elif settings.token_file:
        read_secret(settings.token_file, what="nats token file")
        options["token"] = _rereading(settings.token_file, what="nats token file")
    if settings.nkey_seed_file:
        options["nkeys_seed_str"] = _nkey_seed(settings.nkey_seed_file)
    if settings.creds_file:
        _read_creds(settings.creds_file)
        options.update(_creds_callbacks(settings.creds_file))
    if _wants_tls(settings):
        options["tls"] = _tls_context(settings)
        # TLS before the server's INFO: nats-py otherwise starts TLS only when that plaintext
        # INFO asks for it, and whoever answers first would get the credentials in clear.
        options["tls_handshake_first"] = True
    return options
