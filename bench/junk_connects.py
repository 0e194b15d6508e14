"""An attacker's connect flood: many clients, each sending nats-server a junk token.

Each junk client is a bare socket speaking just enough of the NATS protocol (read INFO, send
CONNECT with the token and a PING, wait for the server's answer or close), so thousands of
them cost the attacker, and the machine running the test, little. The tokens are of every
kind the auth service must refuse: random strings, JWTs signed with a shared secret under the
cluster's key ID, and RS256 JWTs signed by a key of the attacker's own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import secrets
import sys
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

__all__ = ["FloodProcess", "FloodResult", "flood", "junk_tokens"]

_SUBJECT = "system:serviceaccount:dra-suite:dra-health"


@dataclass(frozen=True, slots=True)
class FloodResult:
    sent: int
    refused: int
    """Junk clients the server answered with an error or closed: all of them, if it holds."""
    admitted: int
    seconds: float
    cpu_s: float = 0.0
    """CPU seconds the attacker's process spent connecting (its tokens made before)."""


def junk_tokens(
    count: int, *, kid: str = "forged", audience: str = "nats.dra-suite.io"
) -> list[str]:
    own_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    tokens: list[str] = []
    for index in range(count):
        claims = {"sub": _SUBJECT, "aud": [audience], "exp": int(time.time()) + 3600,
                  "jti": secrets.token_hex(8)}  # fmt: skip
        match index % 3:
            case 0:
                tokens.append(secrets.token_urlsafe(48))
            case 1:
                tokens.append(jwt.encode(claims, secrets.token_bytes(32), headers={"kid": kid}))
            case _:
                tokens.append(jwt.encode(claims, own_key, algorithm="RS256", headers={"kid": kid}))
    return tokens


async def _one(host: str, port: int, token: str, timeout_s: float) -> bool | None:
    """True admitted, False refused, None no answer in time."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            await reader.readline()  # INFO
            connect = {"auth_token": token, "verbose": False, "pedantic": False,
                       "protocol": 1, "name": "junk"}  # fmt: skip
            writer.write(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
            await writer.drain()
            line = await reader.readline()
            return line.startswith((b"PONG", b"+OK"))
    except (TimeoutError, OSError):
        return None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def flood(
    url: str, tokens: list[str], *, concurrency: int = 500, timeout_s: float = 10.0
) -> FloodResult:
    """Connect once per token, `concurrency` at a time, until every one is answered."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 4222
    slots = asyncio.Semaphore(concurrency)

    async def bounded(token: str) -> bool | None:
        async with slots:
            return await _one(host, port, token, timeout_s)

    started, cpu_started = time.perf_counter(), time.process_time()
    answers = await asyncio.gather(*(bounded(token) for token in tokens))
    return FloodResult(
        sent=len(tokens),
        refused=sum(1 for answer in answers if answer is False),
        admitted=sum(1 for answer in answers if answer is True),
        seconds=time.perf_counter() - started,
        cpu_s=time.process_time() - cpu_started,
    )


class FloodProcess:
    """The flood from a process of its own, as an attacker's would be: it competes with the
    auth service and the agents for the CPU, not for their event loop."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @classmethod
    async def start(cls, url: str, count: int, *, kid: str) -> FloodProcess:
        """Returns once the tokens are made and the first connects are going out."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.junk_connects", "--url", url, "--count", str(count),
            f"--kid={kid}", stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert process.stdout is not None
        if (await process.stdout.readline()).strip() != b"flooding":
            raise RuntimeError("the junk flood did not start")
        return cls(process)

    async def result(self) -> FloodResult:
        out, _ = await self._process.communicate()
        if self._process.returncode != 0:
            raise RuntimeError(f"junk flood exited {self._process.returncode}")
        return FloodResult(**json.loads(out))


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.junk_connects")
    parser.add_argument("--url", required=True)
    parser.add_argument("--count", type=int, default=1500)
    parser.add_argument("--kid", default="forged")
    args = parser.parse_args()
    tokens = junk_tokens(args.count, kid=args.kid)
    print("flooding", flush=True)
    result = asyncio.run(flood(args.url, tokens))
    print(json.dumps(dataclasses.asdict(result)))


if __name__ == "__main__":
    main()
