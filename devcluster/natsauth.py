"""What a dev or test nats-server demands of its clients, rendered into a nats-server config file.

Users with passwords, a token, nkey users, decentralized JWT trust (an operator and its
accounts, see `natsjwt`), auth callout with config-mode accounts (the production model: every
client but the auth service's own user is admitted by `dra-nats-auth`), and TLS with optional
client-certificate verification (mutual TLS).
A server without a `ServerAuth` keeps the harness's old behaviour: no config file, no auth.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "APP_ACCOUNT_LIMITS",
    "APP_MAX_PAYLOAD",
    "APP_MAX_SUBSCRIPTIONS",
    "SYS_USER_PERMISSIONS",
    "AuthCallout",
    "JWTTrust",
    "ServerAuth",
    "ServerTLS",
    "render_config",
]

APP_MAX_SUBSCRIPTIONS = 256
APP_MAX_PAYLOAD = 1 << 20
"""Per connection in the app account; nats-server reads the config's `1MB` as 1 MiB."""
APP_ACCOUNT_LIMITS = (
    "jetstream: { max_memory: 512MB, max_file: 1280MB, max_streams: 16, max_consumers: 50000 }",
    f"limits: {{ max_connections: 20000, max_subscriptions: {APP_MAX_SUBSCRIPTIONS}, "
    "max_payload: 1MB }",
)
"""The app account's limits, as `deploy/kustomize/base/nats.yaml` sets them: room for the
streams' reservations (1 GiB) and for 5,000 nodes (3 connections and 9 consumers each).
`max_subscriptions` and `max_payload` bound every connection of the account, callout users
included; nats-server 2.15 ignores the per-user `subs`, `data` and `payload` of a callout's
user JWT, so these are the bounds that hold."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerTLS:
    cert_file: Path
    key_file: Path
    ca_file: Path | None = None
    """The CA that signs client certificates; required by `verify_clients`."""
    verify_clients: bool = False
    """Mutual TLS: a client without a certificate signed by `ca_file` is refused."""

    def __post_init__(self) -> None:
        if self.verify_clients and self.ca_file is None:
            raise ValueError("verify_clients needs the ca_file that signs client certificates")


@dataclass(frozen=True, slots=True, kw_only=True)
class JWTTrust:
    """Decentralized auth: the operator's JWT and the account JWTs it signed, preloaded."""

    operator_jwt: str
    system_account: str
    """Public key of the system account (JetStream needs one)."""
    account_jwts: Mapping[str, str]
    """Account public key (A...) -> account JWT."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthCallout:
    """Config-mode accounts `DRA` (JetStream), `AUTH` (the callout's own user) and `SYS`
    (with `sys_password`, the auth service's second user, as `deploy/.../nats.yaml` has it).

    nats-server asks the auth service (user `auth_user` of account AUTH) about every other
    client; the service answers with a user JWT for `app_account`, signed by `issuer`.
    """

    issuer: str
    """Public key (A...) of the issuer account nkey the auth service signs with."""
    auth_password: str
    xkey: str = ""
    """Public curve key (X...) of the auth service: requests are sealed to it."""
    auth_user: str = "dra-nats-auth"
    app_account: str = "DRA"
    sys_password: str = ""
    """Password of `sys_user` in SYS (connz and kick, to end a revoked node's connections);
    empty: no SYS user, as before."""
    sys_user: str = "dra-nats-auth-sys"
    account_limits: tuple[str, ...] = APP_ACCOUNT_LIMITS
    """The app account's limits; a cluster whose streams have 3 replicas reserves 3 times
    their max_bytes against `max_file`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerAuth:
    users: Mapping[str, str] = field(default_factory=dict)
    """User name -> plain-text password (a test server; never a real deployment's habit)."""
    token: str = ""
    nkeys: tuple[str, ...] = ()
    """Public keys (U...) of nkey users."""
    jwt: JWTTrust | None = None
    callout: AuthCallout | None = None
    tls: ServerTLS | None = None

    def __post_init__(self) -> None:
        if self.token and (self.users or self.nkeys):
            raise ValueError("nats-server takes a token or a users list, not both")
        if self.jwt is not None and (self.token or self.users or self.nkeys):
            raise ValueError("JWT trust replaces the authorization block; give one of them")
        if self.callout is not None and (self.token or self.users or self.nkeys or self.jwt):
            raise ValueError("auth callout brings its own accounts; give no other auth")
        if any(not key.startswith("U") for key in self.nkeys):
            raise ValueError("nkey users are public user keys (U...)")


def _quote(value: str | Path) -> str:
    return json.dumps(str(value))


def render_config(auth: ServerAuth) -> str:
    """The nats-server config text for `auth` (listen address, port and JetStream are flags)."""
    lines: list[str] = []
    if auth.token:
        lines += ["authorization {", f"  token: {_quote(auth.token)}", "}"]
    elif auth.users or auth.nkeys:
        lines += ["authorization {", "  users: ["]
        lines += [
            f"    {{user: {_quote(user)}, password: {_quote(password)}}}"
            for user, password in auth.users.items()
        ]
        lines += [f"    {{nkey: {_quote(key)}}}" for key in auth.nkeys]
        lines += ["  ]", "}"]
    if auth.jwt is not None:
        lines += [f"operator: {_quote(auth.jwt.operator_jwt)}", "resolver: MEMORY"]
        lines += [f"system_account: {_quote(auth.jwt.system_account)}"]
        lines += ["resolver_preload: {"]
        lines += [f"  {key}: {_quote(jwt)}" for key, jwt in auth.jwt.account_jwts.items()]
        lines += ["}"]
    if auth.callout is not None:
        lines += _callout_lines(auth.callout)
    if auth.tls is not None:
        tls = auth.tls
        lines += ["tls {", f"  cert_file: {_quote(tls.cert_file)}"]
        lines += [f"  key_file: {_quote(tls.key_file)}"]
        if tls.ca_file is not None:
            lines += [f"  ca_file: {_quote(tls.ca_file)}"]
        lines += [f"  verify: {'true' if tls.verify_clients else 'false'}", "  timeout: 5"]
        # The handshake before INFO, as the deployed server does (clients insist on it).
        lines += ["  handshake_first: true", "}"]
    return "\n".join(lines) + "\n"


SYS_USER_PERMISSIONS = (
    'publish: { allow: ["$SYS.REQ.SERVER.*.CONNZ", "$SYS.REQ.SERVER.*.KICK"] }',
    'subscribe: { allow: ["_INBOX.>"] }',
)
"""What the auth service's SYS user may do: list connections and kick one, nothing else."""


def _callout_lines(callout: AuthCallout) -> list[str]:
    xkey = [f"    xkey: {_quote(callout.xkey)}"] if callout.xkey else []
    auth_users = [callout.auth_user]
    sys_users = "  SYS: {}"
    if callout.sys_password:
        auth_users.append(callout.sys_user)
        sys_users = (
            f"  SYS: {{ users: [{{user: {_quote(callout.sys_user)}, "
            f"password: {_quote(callout.sys_password)}, "
            f"permissions: {{ {', '.join(SYS_USER_PERMISSIONS)} }} }}] }}"
        )
    return [
        "accounts {",
        f"  {callout.app_account}: {{",
        *[f"    {line}" for line in callout.account_limits],
        "  }",
        "  AUTH: { users: [",
        f"    {{user: {_quote(callout.auth_user)}, password: {_quote(callout.auth_password)}}}",
        "  ] }",
        sys_users,
        "}",
        "system_account: SYS",
        "authorization {",
        "  auth_callout {",
        f"    issuer: {_quote(callout.issuer)}",
        f"    auth_users: [{', '.join(_quote(user) for user in auth_users)}]",
        "    account: AUTH",
        *xkey,
        "  }",
        "}",
    ]
