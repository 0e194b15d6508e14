"""The API emulator measured against the real kube-apiserver: every request class of
parity_cases.py goes to both, and their answers (status code, reason, field paths of the
causes; the item count of a list) must agree, or be a difference listed as known with its
reason. A known difference that is gone fails too, so the list stays true. The report of
every difference is printed (`pytest -s`)."""

from __future__ import annotations

import itertools
import json
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from devcluster.apiserver import APIServerEmulator, ClusterConfig
from devcluster.apiserver.config import SUPPORTED_VERSIONS
from devcluster.controlplane import RealControlPlane, register_node
from devcluster.controlplane.nodes import wait_for_service_account
from shared.kube.client import KubeClient
from tests.k8s.parity_cases import KNOWN_DIFFERENCES, Case, Request, cases

pytestmark = pytest.mark.k8s

_runs = itertools.count(1)
Answer = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    context: ssl.SSLContext | bool

    async def send(self, session: aiohttp.ClientSession, request: Request) -> Answer:
        data = None if request.body is None else json.dumps(request.body)
        headers = {"Content-Type": request.content_type, "Accept": "application/json"}
        async with session.request(
            request.method, self.url + request.path, data=data, headers=headers,
            ssl=self.context,
        ) as response:  # fmt: skip
            body = await response.json(content_type=None)
        return _answer(response.status, body)


def _answer(status: int, body: Any) -> Answer:
    """What is compared: the code, and for a list its size, for a Status its reason and the
    sorted field paths of its causes, for a TokenReview whether it authenticated."""
    if not isinstance(body, dict):
        return (status,)
    if body.get("kind") == "Status":
        causes = (body.get("details") or {}).get("causes") or []
        return (status, body.get("reason"), tuple(sorted({c.get("field", "") for c in causes})))
    if body.get("kind") == "TokenReview":
        return (status, body["status"].get("authenticated", False))
    if "items" in body:
        return (status, len(body["items"]))
    return (status,)


async def _prepare(session: aiohttp.ClientSession, target: Target, namespace: str) -> None:
    for request in (
        Request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}}),
        Request("POST", "/apis/resource.k8s.io/v1/deviceclasses", {
            "metadata": {"name": "parity-class"},
            "spec": {"selectors": [{"cel": {"expression": "true"}}]}}),
    ):  # fmt: skip
        await target.send(session, request)


async def test_the_emulator_answers_as_kube_apiserver_does(control_plane: RealControlPlane):
    minor = control_plane.release.minor
    emulated = minor if minor in SUPPORTED_VERSIONS else SUPPORTED_VERSIONS[-1]
    run = next(_runs)
    namespace, node = f"parity-{run}", f"parity-node-{run}"
    admin = await KubeClient.connect(control_plane.kube_settings())
    try:
        await register_node(admin, node)
        real = Target(control_plane.url, control_plane.admin_ssl_context())
        async with (
            APIServerEmulator(ClusterConfig.for_tests(emulated)) as emulator,
            aiohttp.ClientSession() as session,
        ):
            emulator.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
            emulated_target = Target(emulator.url, False)
            for target in (real, emulated_target):
                await _prepare(session, target, namespace)
            await wait_for_service_account(admin, namespace)
            differences = {}
            for case in cases(namespace, node):
                answers = [await _run(session, t, case) for t in (real, emulated_target)]
                if answers[0] != answers[1]:
                    differences[case.name] = answers
    finally:
        await admin.close()
    report = "\n".join(
        f"  {name}: kube-apiserver {r} / emulator {e}" for name, (r, e) in differences.items()
    )
    print(
        f"\nemulator {emulated} against kube-apiserver {control_plane.release.version}:\n{report}"
    )
    unexpected = sorted(set(differences) - set(KNOWN_DIFFERENCES))
    gone = sorted(set(KNOWN_DIFFERENCES) - set(differences))
    assert not unexpected, f"differences not listed as known:\n{report}"
    assert not gone, f"known differences that are gone: {gone}"


async def _run(session: aiohttp.ClientSession, target: Target, case: Case) -> Answer:
    for request in case.setup:
        await target.send(session, request)
    return await target.send(session, case.request)
