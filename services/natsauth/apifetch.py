"""GET a non-resource path of the API server with an `Accept` of our choosing.

`shared.kube.KubeClient.get_path` asks for `application/json` only, and kube-apiserver serves
the JWKS only as `application/jwk-set+json` (406 otherwise). This goes through the same
authenticated client (kubeconfig or in-cluster token), asking for exactly the type wanted.
"""

from __future__ import annotations

import aiohttp

from shared.errors import KubeError, KubeTransientError
from shared.kube.client import KubeClient

__all__ = ["KubeFetch"]


class KubeFetch:
    def __init__(self, kube: KubeClient, *, timeout_s: float = 5.0) -> None:
        self._kube = kube
        self._timeout_s = timeout_s

    async def __call__(self, path: str, *, accept: str) -> bytes:
        # KubeClient has no per-call Accept; its ApiClient is the one authenticated client.
        api = self._kube._api
        try:
            response: aiohttp.ClientResponse = await api.call_api(
                path, "GET", header_params={"Accept": accept}, auth_settings=["BearerToken"],
                _preload_content=False, _request_timeout=self._timeout_s,
            )  # fmt: skip
            try:
                data = await response.read()
            finally:
                response.release()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeTransientError(f"get {path}: {type(exc).__name__}: {exc}") from exc
        if not 200 <= response.status < 300:
            raise KubeError(f"get {path}: HTTP {response.status}", status=response.status)
        return data
