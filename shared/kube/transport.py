"""The HTTP session under kubernetes-asyncio, made to behave like client-go's transport.

kubernetes-asyncio opens its aiohttp session with `trust_env=True`. aiohttp then looks up
`~/.netrc` and the proxy variables on a worker thread for every request: two thread hops on
the path of every claim read, and a `~/.netrc` entry for the API host would clash with the
bearer token ("Cannot combine AUTHORIZATION header with AUTH argument"). client-go reads the
proxy variables once per process (Go's `http.ProxyFromEnvironment` caches them) and never
reads `~/.netrc`. `use_static_proxy_settings` gives the session those semantics: the proxy for
the API server is decided once, from the kubeconfig's `proxy-url` or else from
`HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY`, and the session stops consulting the environment.
"""

from __future__ import annotations

import urllib.parse
import urllib.request

import aiohttp
from kubernetes_asyncio import client as k8s_client

__all__ = ["environment_proxy", "use_static_proxy_settings"]

_READ_BUFSIZE = 2**21
"""kubernetes-asyncio's read buffer: watch events of large objects exceed aiohttp's default."""


def environment_proxy(server: str) -> str | None:
    """The proxy that `HTTPS_PROXY`/`HTTP_PROXY` (either case) name for `server`, unless
    `NO_PROXY` exempts it; None when no proxy applies. urllib's reading of the variables."""
    url = urllib.parse.urlsplit(server)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(url.scheme or "https")
    if not proxy or not url.hostname:
        return None
    if urllib.request.proxy_bypass_environment(url.netloc, proxies):  # type: ignore[attr-defined]  # undocumented in typeshed
        return None
    return proxy


def use_static_proxy_settings(api: k8s_client.ApiClient) -> None:
    """Swap `api`'s session for one that never reads the environment, with the proxy decided
    now (aiohttp sends the credentials of a proxy URL itself); the connection pool and its TLS
    settings are kept."""
    configuration = api.configuration
    rest = api.rest_client
    if not configuration.proxy:
        proxy = environment_proxy(str(configuration.host))
        if proxy:
            configuration.proxy = rest.proxy = proxy
    previous: aiohttp.ClientSession = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=previous.connector,
        trust_env=False,
        read_bufsize=_READ_BUFSIZE,
    )
    previous.detach()
