"""An API answer that is not decodable JSON is a KubeError for that call, never a ValueError.

A real API server stores opaque claim parameters as raw JSON, so a claim may carry a number
longer than Python's 4300-digit int limit: reading that claim must fail only that claim.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from devcluster.apiserver import kubeconfig
from shared.config import KubeSettings
from shared.errors import KubeError, KubeTransientError
from shared.kube import resources
from shared.kube.client import KubeClient

HUGE_NUMBER = "9" * 5000


async def _claim(_: web.Request) -> web.Response:
    body = '{"kind": "ResourceClaim", "spec": {"limit": ' + HUGE_NUMBER + "}}"
    return web.Response(text=body, content_type="application/json")


async def _deep_claim(_: web.Request) -> web.Response:
    levels = 3000  # the API server accepts it; Python's decoder recurses once per level
    body = '{"kind": "ResourceClaim", "spec": ' + '{"a":' * levels + "1" + "}" * levels + "}"
    return web.Response(text=body, content_type="application/json")


async def _not_json(_: web.Request) -> web.Response:
    return web.Response(text="<html>proxy error</html>", content_type="application/json")


async def _watch(_: web.Request) -> web.Response:
    return web.Response(text='{"type": "ADDED", "object": \n', content_type="application/json")


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[KubeClient]:
    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/huge", _claim)
    app.router.add_get(
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/deep", _deep_claim
    )
    app.router.add_get("/api/v1/nodes/garbled", _not_json)
    app.router.add_get("/api/v1/nodes", _watch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    path = kubeconfig.write(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    connected = await KubeClient.connect(KubeSettings(kubeconfig=str(path)))
    yield connected
    await connected.close()
    await runner.cleanup()


async def test_a_number_beyond_the_int_limit_is_a_kube_error(client: KubeClient):
    with pytest.raises(KubeError, match="not decodable JSON"):
        await client.get(resources.RESOURCE_CLAIMS, "huge", namespace="default")


async def test_json_nested_beyond_the_decoders_recursion_is_a_kube_error(client: KubeClient):
    with pytest.raises(KubeError, match="nested too deeply to decode"):
        await client.get(resources.RESOURCE_CLAIMS, "deep", namespace="default")


async def test_an_answer_that_is_not_json_is_a_kube_error(client: KubeClient):
    with pytest.raises(KubeError, match="not decodable JSON") as caught:
        await client.get(resources.NODES, "garbled")
    assert caught.value.status == 200


async def test_a_garbled_watch_event_cuts_the_watch_as_a_transient_error(client: KubeClient):
    with pytest.raises(KubeTransientError, match="undecodable watch event"):
        async for _ in client.watch(resources.NODES, resource_version="1"):
            pass
