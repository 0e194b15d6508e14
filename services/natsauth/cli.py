"""`dra-nats-auth [serve|keygen|migrate-store|revoke-node|…]`: flags and env, then the command.

`serve` (the default) runs the auth callout service; `keygen` prints a new Secret
(`dra-suite-nats-callout`) to stdout; `migrate-store` hands an open bus's JetStream data to the
app account (run in the NATS pod, server stopped, when rolling to the secured bus);
`revoke-node`, `unrevoke-node` and `revoked` edit the revocation list (`revokecli`). The only
module of the service that reads `sys.argv` and `os.environ`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.natsauth import migration, revokecli, secrets
from services.natsauth.agent import AuthService
from services.natsauth.config import AuthServiceConfig
from shared import logging, metrics
from shared.config import (
    KubeSettings,
    LogSettings,
    NATSSettings,
    OpsSettings,
    add_arguments,
    from_args,
)
from shared.errors import ConfigError
from shared.supervisor import run_agent

__all__ = ["GRACE_S", "main", "parse"]

SERVICE = "dra-nats-auth"
GRACE_S = 10.0
_GROUPS = {"nats": NATSSettings, "kube": KubeSettings, "log": LogSettings, "ops": OpsSettings}


def parse(argv: Sequence[str] | None, env: Mapping[str, str]) -> AuthServiceConfig:
    """The serve config from flags, then env twins, then defaults; raises ConfigError."""
    parser = argparse.ArgumentParser(
        prog=f"{SERVICE} serve", description="NATS auth callout: ServiceAccount tokens to users."
    )
    for cls in (*_GROUPS.values(), AuthServiceConfig):
        add_arguments(parser, cls)
    args = parser.parse_args(argv)
    groups: dict[str, Any] = {name: from_args(cls, args, env) for name, cls in _GROUPS.items()}
    return from_args(AuthServiceConfig, args, env, **groups)


def _keygen(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(
        prog=f"{SERVICE} keygen", description="Print a new callout Secret (issuer, xkey, password)."
    )
    parser.add_argument("--namespace", default="dra-suite", help="Namespace of the Secret.")
    args = parser.parse_args(argv)
    print(secrets.secret_manifest(secrets.material(), namespace=args.namespace), end="")


def _migrate_store(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(
        prog=f"{SERVICE} migrate-store",
        description="Move the global account's JetStream data to the app account (server down).",
    )
    parser.add_argument("--store-dir", required=True, help="nats-server's store_dir.")
    parser.add_argument("--target-account", default="DRA", help="The app account.")
    args = parser.parse_args(argv)
    try:
        moved = migration.adopt_global_account(Path(args.store_dir), account=args.target_account)
    except (ConfigError, OSError) as exc:
        print(f"{SERVICE}: {exc}", file=sys.stderr)
        sys.exit(1)
    print(f"{SERVICE}: {'moved' if moved else 'nothing to move'}")


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = ("serve", "keygen", "migrate-store", *revokecli.COMMANDS)
    command = args.pop(0) if args and args[0] in commands else "serve"
    if command in revokecli.COMMANDS:
        sys.exit(revokecli.run(command, args, os.environ))
    if command == "keygen":
        _keygen(args)
        return
    if command == "migrate-store":
        _migrate_store(args)
        return
    try:
        config = parse(args, os.environ)
    except ConfigError as exc:
        print(f"{SERVICE}: {exc}", file=sys.stderr)
        sys.exit(2)
    logging.configure(config.log, service=SERVICE)
    metrics.configure(service=SERVICE)
    sys.exit(asyncio.run(run_agent(AuthService(config), grace_s=GRACE_S)))
