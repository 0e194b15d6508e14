"""Control replies prove their writer: `dractl drain|fault` takes an answer only when the health
agent of the node it asked signed it, for this very request.

A real nats-server carries the requests and replies; the writer keys are certified here by a
test auth key, as `dra-nats-auth` would certify them (the certify exchange itself is tested with
the callout). The responder on node B's control subject stands for whoever could answer there:
node B's health agent, node A's (a compromised node), or a replay of B's earlier answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nkeys  # type: ignore[import-untyped]  # ships no type hints
import pytest
from nats.aio.msg import Msg

from devcluster.certify import certified_writer
from devcluster.natsserver import NATSServerProcess
from services.natsauth.keys import SigningKey, new_signing_seed
from shared.bus.connection import Bus, ControlRequest
from shared.config import NATSSettings
from shared.errors import ReplyRefusedError

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
A, B = "node-a", "node-b"
AUTH = SigningKey.from_seed(
    new_signing_seed(nkeys.PREFIX_BYTE_OPERATOR), nkeys.PREFIX_BYTE_OPERATOR
)
ANSWER = json.dumps({"ok": True, "device": "gpu-0", "drained": True}).encode()


def _settings(server: NATSServerProcess, tmp_path: Path, mode: str) -> NATSSettings:
    key_file = tmp_path / "auth.pub"
    key_file.write_text(AUTH.public)
    return NATSSettings(
        url=server.url, namespace=f"replies-{mode}", bus_signatures=mode,
        bus_auth_key_file=str(key_file),
    )  # fmt: skip


def _certify(bus: Bus, *, role: str, node: str) -> None:
    """Install a certificate for the bus's writer key, as the auth service would issue it."""
    writer = bus.records.writer
    assert writer is not None
    certified_writer(AUTH, role=role, node=node, now=time.time(), writer=writer)


@contextlib.asynccontextmanager
async def _connected(settings: NATSSettings, *, component: str, node: str) -> AsyncIterator[Bus]:
    bus = Bus(settings, name=f"test-{component}-{node}", component=component, node=node)
    if component == "health":
        _certify(bus, role="health", node=node)
    task = asyncio.create_task(bus.run())
    try:
        await asyncio.wait_for(bus.connected.wait(), 10)
        yield bus
    finally:
        await bus.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def _answering(
    settings: NATSSettings, *, as_node: str, how: str
) -> AsyncIterator[list[Msg | ControlRequest]]:
    """A responder on node B's drain subject, holding `as_node`'s health identity."""
    seen: list[Msg | ControlRequest] = []
    async with _connected(settings, component="health", node=as_node) as health:
        subject = health.names.drain_control(DRIVER, B)
        earlier: list[tuple[str, dict[str, str]]] = []

        async def serve(request: ControlRequest) -> None:
            seen.append(request)
            await request.respond(ANSWER)  # as the health agent answers: signed

        async def handle(msg: Msg) -> None:
            seen.append(msg)
            if how == "unsigned":
                await msg.respond(ANSWER)
            elif how == "replay":  # B's signed answer to the first request, sent again
                if not earlier:
                    bound = health.names.control_reply(msg.subject, msg.reply)
                    earlier.append((msg.reply, health.records.sign(bound, ANSWER, {})))
                    await health.reply(msg, ANSWER)
                else:
                    await health.nc.publish(msg.reply, ANSWER, headers=earlier[0][1])

        if how == "signed":
            await health.serve(subject, serve)
        else:
            await health.subscribe(subject, handle)
        await health.nc.flush()
        yield seen


async def _ask(settings: NATSSettings) -> dict[str, object]:
    async with _connected(settings, component="operator", node="") as operator:
        reply = await operator.request(
            operator.names.drain_control(DRIVER, B), b'{"device": "gpu-0"}', timeout_s=5
        )
        answer: dict[str, object] = json.loads(reply.data)
        return answer


async def test_the_nodes_own_signed_answer_is_taken(nats_server, tmp_path):
    settings = _settings(nats_server, tmp_path, "enforce")
    async with _answering(settings, as_node=B, how="signed") as seen:
        assert (await _ask(settings))["drained"] is True
    assert len(seen) == 1


@pytest.mark.parametrize(
    ("as_node", "how", "reason"),
    [
        (A, "signed", "wrong_owner"),  # another node's health agent answers for B
        (B, "unsigned", "unsigned"),
    ],
)
async def test_an_answer_not_signed_by_the_nodes_health_agent_is_refused(
    nats_server, tmp_path, as_node, how, reason
):
    settings = _settings(nats_server, tmp_path, "enforce")
    async with _answering(settings, as_node=as_node, how=how):
        with pytest.raises(ReplyRefusedError, match=rf"\({reason}\)"):
            await _ask(settings)


async def test_a_signed_answer_replayed_to_a_later_request_is_refused(nats_server, tmp_path):
    settings = _settings(nats_server, tmp_path, "enforce")
    async with _answering(settings, as_node=B, how="replay"):
        assert (await _ask(settings))["ok"] is True
        with pytest.raises(ReplyRefusedError, match=r"\(bad_signature\)"):
            await _ask(settings)


async def test_accept_mode_takes_an_unsigned_answer_during_a_rollout(nats_server, tmp_path):
    settings = _settings(nats_server, tmp_path, "accept")
    async with _answering(settings, as_node=B, how="unsigned"):
        assert (await _ask(settings))["ok"] is True
