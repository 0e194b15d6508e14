"""A claim nested deeper than any real one fails alone: its decoding error is that claim's error.

The API server accepts 3,000 levels of JSON in opaque parameters; Python's decoder gives up at
about 1,000 with a RecursionError. The claims are served over HTTP by a small app and read by
the real `KubeClient`, so the whole path from bytes to the claim's answer is the production one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from devcluster.apiserver import kubeconfig
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim import nesting
from services.allocation.claim.checkpoint import CheckpointStore, PreparedClaim
from services.allocation.claim.claims import ClaimReader, ClaimRef
from services.allocation.dra.preparer import ClaimPreparer
from shared.config import KubeSettings
from shared.errors import ClaimError
from shared.kube.client import KubeClient
from tests.fakes.allocation_sources import FakeInventory

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}"


def _nested_json(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def _claim_text(make_claim: Any, *, uid: str, name: str, parameters: str) -> str:
    """The claim as JSON text, its opaque parameters spliced in raw (json.dumps would recurse)."""
    config = [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER}}]
    claim = make_claim(uid=uid, name=name, devices=["npu-0"], config=config)
    text = json.dumps(claim)
    marker = f'"opaque": {{"driver": "{DRIVER}"}}'
    assert marker in text
    return text.replace(marker, marker[:-1] + f', "parameters": {parameters}}}')


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[dict[str, str], KubeClient]]:
    """(claim name -> JSON text served for it, a KubeClient of the app serving them)."""
    bodies: dict[str, str] = {}

    async def claim(request: web.Request) -> web.Response:
        return web.Response(
            text=bodies[request.match_info["name"]], content_type="application/json"
        )

    app = web.Application()
    app.router.add_get(CLAIMS.format(name="{name}"), claim)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    path = kubeconfig.write(tmp_path / "kubeconfig", f"http://127.0.0.1:{runner.addresses[0][1]}")
    client = await KubeClient.connect(KubeSettings(kubeconfig=str(path)))
    try:
        yield bodies, client
    finally:
        await client.close()
        await runner.cleanup()


@pytest.mark.parametrize("levels", [3000, 200], ids=["beyond-the-decoder", "beyond-the-bound"])
async def test_a_deeply_nested_claim_fails_alone_and_the_others_are_prepared(
    served, tmp_path, make_claim, make_inventory, levels
):
    bodies, client = served
    good, deep = str(uuid.uuid4()), str(uuid.uuid4())
    bodies["good"] = json.dumps(make_claim(uid=good, name="good", devices=["npu-0"]))
    bodies["deep"] = _claim_text(make_claim, uid=deep, name="deep", parameters=_nested_json(levels))
    checkpoints = CheckpointStore(tmp_path / "checkpoint")
    checkpoints.load()
    cdi_writer = CDIWriter(tmp_path / "cdi", driver=DRIVER)
    cdi_writer.prepare_root()
    preparer = ClaimPreparer(
        claims=ClaimReader(client, driver=DRIVER, pool=NODE, attempts=1),
        inventory=FakeInventory(make_inventory("npu-0")),
        checkpoints=checkpoints,
        cdi_writer=cdi_writer,
        driver=DRIVER,
        backend="sim",
    )
    refs = [ClaimRef("default", "good", good), ClaimRef("default", "deep", deep)]
    outcomes = await preparer.prepare_batch(refs)
    assert isinstance(outcomes[good], PreparedClaim)
    assert isinstance(outcomes[deep], ClaimError)
    assert "nested" in str(outcomes[deep])
    assert checkpoints.get(deep) is None


@pytest.mark.parametrize(
    ("document", "deepest"),
    [
        (1, 0),
        ({}, 1),
        ({"a": [1, {"b": []}]}, 4),
        ([[[[]]]], 4),
    ],
    ids=["scalar", "empty-object", "mixed", "lists"],
)
def test_depth_counts_containers_without_recursion(document, deepest):
    assert nesting.depth(document, limit=10) == deepest


def test_depth_stops_counting_at_the_limit():
    document: Any = 1
    for _ in range(5000):  # deeper than the interpreter's recursion limit
        document = [document]
    assert nesting.depth(document, limit=64) == 65
