"""`dra-nats-auth revoke-node|unrevoke-node|revoked`: the operator's side of the revocation list.

Run with the operator's own Kubernetes credentials (`--kubeconfig` or `KUBECONFIG`): it edits
ConfigMap `dra-nats-auth-revocations`, which Kubernetes RBAC lets only the operator group change
and whose every change the API server's audit log records. The auth service's replicas pick the
change up within `--revocation-poll-s`, refuse the node and end its live connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence

from services.natsauth import revocations
from services.natsauth.revocations import Revocation
from services.natsauth.revocationstore import RevocationStore
from shared.config import KubeSettings, add_arguments, from_args
from shared.errors import ConfigError, DraSuiteError
from shared.kube.client import KubeClient

__all__ = ["COMMANDS", "parse_until", "run"]

COMMANDS = ("revoke-node", "unrevoke-node", "revoked")
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_until(value: str, *, now: float) -> float | None:
    """`--until`: empty (no end), a duration from now (`90s`, `30m`, `12h`, `7d`) or an RFC 3339
    time with zone; raises ConfigError."""
    if not value:
        return None
    if match := _DURATION.match(value):
        return now + int(match[1]) * _UNIT_S[match[2]]
    until = revocations.parse({"x": json.dumps({"until": value})})["x"]
    if until.malformed or until.until is None:
        raise ConfigError(f"--until {value!r}: not a duration (30m) nor an RFC 3339 time")
    if until.until <= now:
        raise ConfigError(f"--until {value!r} is in the past")
    return until.until


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"dra-nats-auth {command}")
    if command != "revoked":
        parser.add_argument("node", help="The node whose bus identity is cut (or restored).")
    if command == "revoke-node":
        parser.add_argument("--until", default="", help="Duration (12h) or RFC 3339 time.")
        parser.add_argument("--reason", default="", help="Why, for the record and the logs.")
    parser.add_argument("--namespace", default="dra-suite", help="Namespace of the service.")
    parser.add_argument(
        "--configmap", default=revocations.CONFIGMAP, help="The revocation list's ConfigMap."
    )
    add_arguments(parser, KubeSettings)
    return parser


async def _run(command: str, args: argparse.Namespace, kube_settings: KubeSettings) -> str:
    kube = await KubeClient.connect(kube_settings)
    try:
        store = RevocationStore(kube, namespace=args.namespace, name=args.configmap)
        if command == "revoke-node":
            now = time.time()
            until = parse_until(args.until, now=now)
            await store.revoke(Revocation(
                node=args.node, until=until, reason=args.reason, at=revocations.at_now(now),
            ))  # fmt: skip
            end = "until unrevoked" if until is None else f"until {revocations.at_now(until)}"
            return f"node {args.node} revoked {end}"
        if command == "unrevoke-node":
            if await store.unrevoke(args.node):
                return f"node {args.node} unrevoked"
            return f"node {args.node} was not revoked"
        entries = await store.read()
        return "\n".join(revocations.encode_line(e) for e in entries.values()) or "(none)"
    finally:
        await kube.close()


def run(command: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    args = _parser(command).parse_args(argv)
    try:
        if command != "revoked" and not re.fullmatch(r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?", args.node):
            raise ConfigError(f"{args.node!r} is not a node name")
        kube_settings = from_args(KubeSettings, args, env)
        print(asyncio.run(_run(command, args, kube_settings)))
    except (ConfigError, DraSuiteError) as exc:
        print(f"dra-nats-auth {command}: {exc}", file=sys.stderr)
        return 1
    return 0
