"""The API client's proxy and credential handling, as client-go's: the proxy variables are read
once at connect, NO_PROXY exempts the API server, a kubeconfig `proxy-url` wins, and
`~/.netrc` is never read (an entry for the API host must not clash with the bearer token).

Real HTTP: an aiohttp server plays the API server, another plays the proxy.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from devcluster.apiserver import kubeconfig
from shared.config import KubeSettings
from shared.kube.client import KubeClient
from shared.kube.transport import environment_proxy

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")


@dataclass
class Endpoint:
    name: str
    url: str = ""
    seen: list[web.BaseRequest] = field(default_factory=list)


@contextlib.asynccontextmanager
async def serving(name: str) -> AsyncIterator[Endpoint]:
    """An HTTP server that answers every request with `{"gitVersion": name}` and records it."""
    endpoint = Endpoint(name)

    async def answer(request: web.BaseRequest) -> web.Response:
        endpoint.seen.append(request)
        return web.json_response({"gitVersion": endpoint.name})

    # A low-level server: it also takes the absolute-form targets a client sends to a proxy.
    runner = web.ServerRunner(web.Server(answer))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    endpoint.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield endpoint
    finally:
        await runner.cleanup()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
async def api() -> AsyncIterator[Endpoint]:
    async with serving("direct") as endpoint:
        yield endpoint


@pytest.fixture
async def proxy() -> AsyncIterator[Endpoint]:
    async with serving("via-proxy") as endpoint:
        yield endpoint


@pytest.fixture
def connect(tmp_path: Path) -> Callable[..., AsyncIterator[KubeClient]]:
    async def connected(
        server: str, *, token: str | None = None, proxy_url: str = ""
    ) -> AsyncIterator[KubeClient]:
        document = kubeconfig.kubeconfig(server, token=token)
        if proxy_url:
            document["clusters"][0]["cluster"]["proxy-url"] = proxy_url
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(document))
        client = await KubeClient.connect(KubeSettings(kubeconfig=str(path)))
        try:
            yield client
        finally:
            await client.close()

    return connected


async def _version(connect: Callable[..., AsyncIterator[KubeClient]], *args, **kwargs) -> str:
    async for client in connect(*args, **kwargs):
        return str((await client.get_path("/version"))["gitVersion"])
    raise AssertionError("no client")


async def test_the_proxy_from_the_environment_gets_the_request_and_its_credentials(
    monkeypatch: pytest.MonkeyPatch, api: Endpoint, proxy: Endpoint, connect
):
    host = proxy.url.removeprefix("http://")
    monkeypatch.setenv("HTTP_PROXY", f"http://ops:p%40ss@{host}")

    assert await _version(connect, api.url) == "via-proxy"

    (request,) = proxy.seen
    assert str(request.url) == f"{api.url}/version"
    expected = base64.b64encode(b"ops:p@ss").decode()
    assert request.headers["Proxy-Authorization"] == f"Basic {expected}"
    assert api.seen == []


async def test_no_proxy_exempts_the_api_server(
    monkeypatch: pytest.MonkeyPatch, api: Endpoint, proxy: Endpoint, connect
):
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")

    assert await _version(connect, api.url) == "direct"
    assert proxy.seen == []


async def test_the_proxy_variables_are_read_once_at_connect(
    monkeypatch: pytest.MonkeyPatch, api: Endpoint, proxy: Endpoint, connect
):
    async for client in connect(api.url):
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        assert (await client.get_path("/version"))["gitVersion"] == "direct"
    assert proxy.seen == []


async def test_the_kubeconfig_proxy_url_wins_over_no_proxy(
    monkeypatch: pytest.MonkeyPatch, api: Endpoint, proxy: Endpoint, connect
):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")

    assert await _version(connect, api.url, proxy_url=proxy.url) == "via-proxy"


async def test_a_netrc_entry_for_the_api_host_does_not_clash_with_the_token(
    tmp_path: Path, api: Endpoint, connect
):
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)

    assert await _version(connect, api.url, token="abc") == "direct"

    (request,) = api.seen
    assert request.headers["Authorization"] == "Bearer abc"


@pytest.mark.parametrize(
    ("environ", "server", "expected"),
    [
        ({"HTTPS_PROXY": "http://p:3128"}, "https://api.example:6443", "http://p:3128"),
        (
            {"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:1"},
            "https://a",
            "http://lower:1",
        ),
        ({"HTTP_PROXY": "http://p:3128"}, "https://api.example:6443", None),
        ({"HTTPS_PROXY": "http://p", "NO_PROXY": ".example"}, "https://api.example", None),
        ({"HTTPS_PROXY": "http://p", "NO_PROXY": "*"}, "https://api.example", None),
        ({"HTTPS_PROXY": "http://p", "NO_PROXY": "other"}, "https://api.example", "http://p"),
    ],
)
def test_environment_proxy_follows_the_usual_variables(
    monkeypatch: pytest.MonkeyPatch,
    environ: dict[str, str],
    server: str,
    expected: str | None,
):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert environment_proxy(server) == expected
