"""An operator's read of a whole fleet's records (`reading.latest_values`, what dractl
--all-nodes uses) checks every record's signature, also when there are enough of them to be
checked on several threads: a forged or tampered record among hundreds of good ones is left out
and named, and every good one is taken with its own value."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nkeys  # type: ignore[import-untyped]  # ships no type hints
import pytest
from nats.js.api import KeyValueConfig

from devcluster.certify import certified_writer
from services.natsauth.keys import SigningKey, new_signing_seed
from shared.bus import reading
from shared.bus.connection import Bus
from shared.bus.subjects import Names, token
from shared.config import NATSSettings
from tests.integration.security.callout_stack import connected

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODES = 75
DEVICES = 8  # 600 records: more than are checked on the event loop alone


@contextlib.asynccontextmanager
async def _operator(settings: NATSSettings, tmp_path: Path, auth: SigningKey) -> AsyncIterator[Bus]:
    key_file = tmp_path / "certify.pub"
    key_file.write_text(auth.public + "\n")
    checking = NATSSettings(
        url=settings.url,
        namespace=settings.namespace,
        bus_signatures="enforce",
        bus_auth_key_file=str(key_file),
    )
    async with connected(checking) as reader:
        yield reader


async def test_a_forged_and_a_tampered_record_among_hundreds_are_left_out(
    nats_settings: NATSSettings, tmp_path: Path
):
    auth = SigningKey.from_seed(
        new_signing_seed(nkeys.PREFIX_BYTE_OPERATOR), nkeys.PREFIX_BYTE_OPERATOR
    )
    names, now = Names(nats_settings.namespace), time.time()
    writers = {
        f"node-{i:03d}": certified_writer(
            auth, role="health", node=f"node-{i:03d}", now=now, lifetime_s=600
        )
        for i in range(NODES)
    }
    records = []
    for node, writer in writers.items():
        for index in range(DEVICES):
            key = names.health_key(DRIVER, node, f"gpu-{index}")
            subject = names.kv_subject(names.health_bucket, key)
            data = f"{node}/gpu-{index}".encode()
            records.append((key, subject, data, writer.headers(subject, data, {})))
    random.Random(3).shuffle(records)  # a fleet's records come in no order of node
    # Node 1 signs, as itself, a record it puts on node 2's key; node 3's record is altered
    # after it was signed.
    forged_key = names.health_key(DRIVER, "node-002", "gpu-0")
    forged_subject = names.kv_subject(names.health_bucket, forged_key)
    forged = writers["node-001"].headers(forged_subject, b"node-002/gpu-0", {})
    tampered_key = names.health_key(DRIVER, "node-003", "gpu-1")
    tampered_subject = names.kv_subject(names.health_bucket, tampered_key)
    tampered = writers["node-003"].headers(tampered_subject, b"node-003/gpu-1", {})
    refused: list[tuple[str, str]] = []
    async with _operator(nats_settings, tmp_path, auth) as reader:
        await reader.js.create_key_value(KeyValueConfig(bucket=names.health_bucket, history=1))
        for _, subject, data, headers in records:
            await reader.js.publish(subject, data, headers=headers)
        await reader.js.publish(forged_subject, b"node-002/gpu-0", headers=forged)
        await reader.js.publish(tampered_subject, b"node-003/gpu-1 healthy", headers=tampered)
        found = await reading.latest_values(
            reader,
            names.health_bucket,
            f"{token(DRIVER)}.>",
            refused=lambda key, reason: refused.append((key, reason)),
        )
    assert sorted(refused) == [(forged_key, "wrong_owner"), (tampered_key, "bad_signature")]
    wanted = sorted((key, data) for key, _, data, _ in records)
    assert found == [(key, data) for key, data in wanted if key not in (forged_key, tampered_key)]
