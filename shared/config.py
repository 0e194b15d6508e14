"""Typed settings shared by every agent, and the flag/env plumbing that fills them.

Each setting is a dataclass field declared with `setting(...)`: the flag name and help live in
the field metadata, and the env twin is derived mechanically (`--nats-url` <-> `NATS_URL`).
Precedence: flag, then env, then default. Only `cli.py` modules call `from_args`.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from nacl.signing import VerifyKey

from shared import nats_auth, resource, signature_settings
from shared.errors import ConfigError

__all__ = [
    "KubeSettings",
    "LogSettings",
    "NATSSettings",
    "OpsSettings",
    "TelemetrySettings",
    "add_arguments",
    "add_version",
    "env_name",
    "from_args",
    "setting",
]

T = TypeVar("T")
# JetStream's own ceiling for a stream's replicas.
_MAX_REPLICAS = 5


def setting(default: Any, *, flag: str, help: str, secret: bool = False) -> Any:
    """Declare a settings field with its command-line flag and help text.

    A `secret` field stays out of the dataclass repr, so a logged or printed config never
    shows it.
    """
    if isinstance(default, list | dict | set):
        raise TypeError("mutable defaults are not allowed; use a tuple")
    return dataclasses.field(
        default=default, repr=not secret, metadata={"flag": flag, "help": help}
    )


def env_name(flag: str) -> str:
    """`--cdi-root` -> `CDI_ROOT`."""
    return flag.lstrip("-").replace("-", "_").upper()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NATSSettings:
    """Where NATS is, and one way to authenticate (user/password, token, nkey, .creds or URL
    userinfo) plus optional TLS. Building it reads every file it names (`shared.nats_auth`):
    a missing, empty or malformed secret file is a ConfigError (exit 2) before any connect."""

    url: str = setting(
        "nats://127.0.0.1:4222", flag="--nats-url", help="NATS server URL(s), comma-separated."
    )
    namespace: str = setting(
        "",
        flag="--nats-namespace",
        help="Prefix for every subject, bucket and stream name (isolates suites on one server).",
    )
    user: str = setting(
        "", flag="--nats-user", help="NATS user name (with --nats-password[-file])."
    )
    password: str = setting(
        "",
        flag="--nats-password",
        help="NATS password; prefer --nats-password-file (flags and env are easy to leak).",
        secret=True,
    )
    password_file: str = setting(
        "",
        flag="--nats-password-file",
        help="File holding the NATS password (a mounted Secret); read at every connect.",
    )
    token: str = setting(
        "",
        flag="--nats-token",
        help="NATS authentication token; prefer --nats-token-file.",
        secret=True,
    )
    token_file: str = setting(
        "",
        flag="--nats-token-file",
        help="File holding the NATS token (a mounted Secret); read at every connect.",
    )
    nkey_seed_file: str = setting(
        "",
        flag="--nats-nkey-seed-file",
        help="File holding the user's nkey seed (SU...): nkey authentication.",
    )
    creds_file: str = setting(
        "",
        flag="--nats-creds-file",
        help="NATS .creds file (user JWT and nkey seed): JWT authentication.",
    )
    tls_ca_file: str = setting(
        "",
        flag="--nats-tls-ca-file",
        help="PEM CA bundle that verifies the server's certificate; turns TLS on. "
        "Empty with a tls:// URL: the system CAs.",
    )
    tls_cert_file: str = setting(
        "",
        flag="--nats-tls-cert-file",
        help="PEM client certificate for mutual TLS (with --nats-tls-key-file).",
    )
    tls_key_file: str = setting(
        "", flag="--nats-tls-key-file", help="PEM private key of --nats-tls-cert-file."
    )
    connect_timeout_s: float = setting(
        2.0, flag="--nats-connect-timeout-s", help="Timeout of one connection attempt."
    )
    request_timeout_s: float = setting(
        2.0, flag="--nats-request-timeout-s", help="Timeout of one KV/JetStream operation."
    )
    replicas: int = setting(
        1,
        flag="--nats-replicas",
        help="Replicas of the KV buckets and the alert stream this agent creates (1 for one "
        "server, 3 on a 3-server JetStream cluster); an existing one is updated in place.",
    )
    watch_heartbeat_s: float = setting(
        20.0,
        flag="--nats-watch-heartbeat-s",
        help="Idle heartbeat of a KV watch's consumer (dractl's, the quota auditor's; a node "
        "agent's watch holds none); a watch that hears nothing for 3 heartbeats (its "
        "consumer's server died) starts again.",
    )
    bus_signatures: str = setting(
        "off",
        flag="--bus-signatures",
        help="Signed records (docs/security.md): off (open bus), accept (sign; take unsigned "
        "records but count them) or enforce (drop every record its owner did not sign).",
    )
    bus_auth_key_file: str = setting(
        "",
        flag="--bus-auth-key-file",
        help="File holding the auth service's public certify key (O..., `certify.pub` of the "
        "callout Secret); needed unless --bus-signatures is off.",
    )

    def __post_init__(self) -> None:
        if not self.url:
            raise ConfigError("nats url must not be empty", field="url")
        if self.namespace and not self.namespace.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(
                f"nats namespace {self.namespace!r} may hold only letters, digits, '-' and '_'",
                field="namespace",
            )
        if not 1 <= self.replicas <= _MAX_REPLICAS:
            raise ConfigError(
                f"nats replicas {self.replicas} is not within 1..{_MAX_REPLICAS}", field="replicas"
            )
        if not self.watch_heartbeat_s > 0:  # NaN too
            raise ConfigError("nats watch heartbeat must be positive", field="watch_heartbeat_s")
        self._check_auth_combination()
        self._check_signatures()
        nats_auth.check(self)

    def _check_auth_combination(self) -> None:
        """One way to authenticate, each complete; errors name flags, never values."""
        if self.password and self.password_file:
            raise ConfigError(
                "give --nats-password or --nats-password-file, not both", field="password"
            )
        if self.token and self.token_file:
            raise ConfigError("give --nats-token or --nats-token-file, not both", field="token")
        has_password = bool(self.password or self.password_file)
        if has_password and not self.user:
            raise ConfigError("a nats password needs --nats-user", field="user")
        if self.user and not has_password:
            raise ConfigError(
                f"nats user {self.user!r} needs --nats-password-file or --nats-password",
                field="password",
            )
        methods = {
            "--nats-user/--nats-password": bool(self.user),
            "--nats-token": bool(self.token or self.token_file),
            "--nats-nkey-seed-file": bool(self.nkey_seed_file),
            "--nats-creds-file": bool(self.creds_file),
            "credentials in --nats-url": nats_auth.url_has_userinfo(self.url),
        }
        chosen = [name for name, given in methods.items() if given]
        if len(chosen) > 1:
            raise ConfigError(
                f"choose one way to authenticate to NATS, not {' and '.join(chosen)}",
                field="auth",
            )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError(
                "--nats-tls-cert-file and --nats-tls-key-file go together", field="tls_cert_file"
            )

    def _check_signatures(self) -> None:
        if self.bus_signatures not in signature_settings.MODES:
            raise ConfigError(
                f"--bus-signatures {self.bus_signatures!r} is not one of off, accept, enforce",
                field="bus_signatures",
            )
        if self.bus_signatures != signature_settings.OFF:
            self.auth_key()

    def auth_key(self) -> VerifyKey | None:
        """The auth service's certify key, read from its file now; None with signatures off."""
        if self.bus_signatures == signature_settings.OFF:
            return None
        if not self.bus_auth_key_file:
            raise ConfigError(
                f"--bus-signatures {self.bus_signatures} needs --bus-auth-key-file",
                field="bus_auth_key_file",
            )
        text = nats_auth.read_secret(self.bus_auth_key_file, what="bus auth key file")
        try:
            return signature_settings.decode_auth_key(text)
        except ValueError as exc:
            raise ConfigError(
                f"bus auth key file {self.bus_auth_key_file}: {exc}", field="bus_auth_key_file"
            ) from None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KubeSettings:
    kubeconfig: str = setting(
        "",
        flag="--kubeconfig",
        help="Path of a kubeconfig; empty means in-cluster config, else ~/.kube/config.",
    )
    request_timeout_s: float = setting(
        10.0, flag="--kube-request-timeout-s", help="Timeout of one API request."
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LogSettings:
    level: str = setting("info", flag="--log-level", help="debug, info, warning or error.")
    format: str = setting("json", flag="--log-format", help="json (default) or console.")

    def __post_init__(self) -> None:
        if self.level.lower() not in {"debug", "info", "warning", "error"}:
            raise ConfigError(f"log level {self.level!r} is not one of debug/info/warning/error")
        if self.format not in {"json", "console"}:
            raise ConfigError(f"log format {self.format!r} is not json or console")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OpsSettings:
    """The agent's ops HTTP endpoint: /metrics, /healthz, /readyz."""

    ops_host: str = setting("0.0.0.0", flag="--ops-host", help="Address of the ops endpoint.")
    ops_port: int = setting(
        0, flag="--ops-port", help="Port of /metrics, /healthz, /readyz; 0 disables the endpoint."
    )

    def __post_init__(self) -> None:
        if not 0 <= self.ops_port <= 65535:
            raise ConfigError(f"ops port {self.ops_port} is not a TCP port", field="ops_port")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TelemetrySettings:
    otlp_endpoint: str = setting(
        "",
        flag="--otlp-endpoint",
        help="OTLP/gRPC collector endpoint, e.g. http://otel-collector:4317; empty: no export.",
    )
    sample_ratio: float = setting(
        1.0, flag="--trace-sample-ratio", help="Fraction of root traces sampled, 0..1."
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ConfigError("trace sample ratio must be within 0..1", field="sample_ratio")


def _field_types(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _parser_for(annotation: Any) -> Any:
    if annotation is bool:
        return _parse_bool
    if annotation in (int, float, str):
        return annotation
    if annotation is Path:
        return Path
    origin = typing.get_origin(annotation)
    if origin is tuple:
        return _parse_str_tuple
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _parser_for(args[0])
    raise TypeError(f"unsupported settings type {annotation!r}")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def _parse_str_tuple(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _dest(flag: str) -> str:
    """Flags are unique across groups, field names are not (both groups have request_timeout_s)."""
    return flag.lstrip("-").replace("-", "_")


def add_version(parser: argparse.ArgumentParser) -> None:
    """`--version`: `<prog> <installed dra-suite version>`, then exit 0."""
    parser.add_argument(
        "--version", action="version", version=f"{parser.prog} {resource.build_version()}"
    )


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """Add one flag per `setting` field of `cls`, defaulting to its env twin when set."""
    hints = _field_types(cls)
    group = parser.add_argument_group(cls.__name__)
    for field in dataclasses.fields(cls):
        flag = field.metadata.get("flag")
        if flag is None:
            continue
        group.add_argument(
            flag,
            dest=_dest(flag),
            type=_parser_for(hints[field.name]),
            default=None,
            help=f"{field.metadata['help']} [env {env_name(flag)}; default {field.default!r}]",
        )


def from_args(cls: type[T], args: argparse.Namespace, env: Mapping[str, str], **groups: Any) -> T:
    """Build `cls` from parsed flags, then env twins, then field defaults.

    `groups` passes the nested settings groups (`nats=...`) of an agent config as they are.
    """
    hints = _field_types(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]  # cls is a dataclass type
        flag = field.metadata.get("flag")
        if flag is None:
            continue
        given = getattr(args, _dest(flag), None)
        if given is None and env_name(flag) in env:
            raw = env[env_name(flag)]
            try:
                given = _parser_for(hints[field.name])(raw)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                raise ConfigError(f"env {env_name(flag)}={raw!r}: {exc}", field=field.name) from exc
        if given is not None:
            values[field.name] = given
    try:
        return cls(**values, **groups)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{cls.__name__}: {exc}") from exc
