"""`python -m devcluster.apiserver`: run the emulator until SIGTERM/SIGINT.

Prints `apiserver_ready url=<url>` on stdout once it listens. Every flag has an
env twin with the DEVCLUSTER_ prefix (`--port` ↔ `DEVCLUSTER_PORT`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import sys
from collections.abc import Sequence

from devcluster import extra
from devcluster.apiserver.config import ClusterConfig, parse_gates
from devcluster.apiserver.server import APIServerEmulator

__all__ = ["main"]


def _env(flag: str, default: str) -> str:
    return os.environ.get("DEVCLUSTER_" + flag.upper().replace("-", "_"), default)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="apiserver", description="Kubernetes API server emulator")
    p.add_argument("--host", default=_env("host", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(_env("port", "0")), help="0 = a free port")
    p.add_argument("--kubeconfig", default=_env("kubeconfig", ""), help="write a kubeconfig here")
    p.add_argument("--kubernetes-version", default=_env("kubernetes-version", "1.36"))
    p.add_argument("--feature-gates", default=_env("feature-gates", ""), help="A=true,B=false")
    p.add_argument("--token", default=_env("token", ""), help="require this bearer token")
    p.add_argument("--tls-cert-file", default=_env("tls-cert-file", ""), help="serve HTTPS")
    p.add_argument("--tls-key-file", default=_env("tls-key-file", ""))
    p.add_argument(
        "--tls-ca-file",
        default=_env("tls-ca-file", ""),
        help="the CA of the certificate, named in the kubeconfig written",
    )
    return p


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not args.tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.tls_cert_file, args.tls_key_file or None)
    return context


async def _serve(
    config: ClusterConfig,
    *,
    host: str,
    port: int,
    kubeconfig: str,
    tls: ssl.SSLContext | None = None,
    ca_file: str = "",
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = APIServerEmulator(config)
    await server.start(host=host, port=port, tls=tls)
    try:
        if kubeconfig:
            server.write_kubeconfig(kubeconfig, ca_file=ca_file or None)
        print(f"apiserver_ready url={server.url}", flush=True)
        await stop.wait()
    finally:
        await server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        extra.require(*extra.EMULATOR_SCHEMAS)
    except extra.MissingExtraError as exc:
        print(f"apiserver: {exc}", file=sys.stderr)
        sys.exit(1)
    try:
        config = ClusterConfig(
            kubernetes_version=args.kubernetes_version,
            feature_gates=parse_gates(args.feature_gates),
            token=args.token or None,
        )
    except ValueError as exc:
        print(f"apiserver: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        tls = _tls(args)
    except (OSError, ssl.SSLError) as exc:
        print(f"apiserver: TLS certificate: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(
        asyncio.run(
            _serve(
                config,
                host=args.host,
                port=args.port,
                kubeconfig=args.kubeconfig,
                tls=tls,
                ca_file=args.tls_ca_file,
            )
        )
    )
