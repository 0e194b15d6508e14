"""The real Kubernetes control plane for the tests under tests/k8s/.

One control plane per pytest session, of the minor `$K8S` names (newest by default). It starts
before the first test that uses it, outside that test's timeout (pytest-timeout's timer starts
inside this wrapper), with a start-up limit of its own (`$K8S_START_TIMEOUT_S`, 180 s: a cold
start on a loaded 2-core machine), and stops after the last one, so the rest of the suite does
not run beside it. Binaries come from the machine's cache (`make k8s K8S=<minor>` builds them);
without them the tests are skipped with one line saying so, or fail when `CI=true`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devcluster.controlplane import (
    NEWEST,
    ControlPlaneBinaries,
    ControlPlaneNotBuiltError,
    RealControlPlane,
    cached_binaries,
    release,
)
from shared.kube.client import KubeClient
from tests.k8s.background import BackgroundControlPlane

_FIXTURE = "control_plane"


class _SessionControlPlane:
    """Started on first use, stopped after the last test that uses it."""

    def __init__(self, users: int) -> None:
        self.users_left = users
        self.background: BackgroundControlPlane | None = None
        self.failure = ""
        self._tried = False

    def ensure_started(self) -> None:
        if self._tried:
            return
        self._tried = True
        try:
            binaries = cached_binaries(release(os.environ.get("K8S") or NEWEST))
        except ControlPlaneNotBuiltError as exc:
            self.failure = str(exc)
            return
        workdir = Path(tempfile.mkdtemp(prefix="dra-k8s-", dir="/tmp"))
        background = BackgroundControlPlane(binaries, workdir)
        try:
            background.start(timeout_s=float(os.environ.get("K8S_START_TIMEOUT_S", "180")))
        except Exception as exc:
            self.failure = f"the control plane did not start: {exc} (logs in {workdir}/logs)"
            return
        self.background = background

    def done_with_one(self) -> None:
        self.users_left -= 1
        if self.users_left <= 0:
            self.stop()

    def stop(self) -> None:
        background, self.background = self.background, None
        if background is not None:
            background.stop()
            if not os.environ.get("K8S_KEEP_WORKDIR"):  # set it to read the components' logs
                shutil.rmtree(background.plane.workdir, ignore_errors=True)


_SESSION = pytest.StashKey[_SessionControlPlane]()


def pytest_collection_finish(session: pytest.Session) -> None:
    users = sum(_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items)
    session.config.stash[_SESSION] = _SessionControlPlane(users)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    shared = item.config.stash.get(_SESSION, None)
    uses = shared is not None and _FIXTURE in getattr(item, "fixturenames", ())
    if uses:
        assert shared is not None
        shared.ensure_started()
    yield
    if uses:
        assert shared is not None
        shared.done_with_one()


def pytest_sessionfinish(session: pytest.Session) -> None:
    shared = session.config.stash.get(_SESSION, None)
    if shared is not None:
        shared.stop()


@pytest.fixture(scope="session")
def control_plane_binaries() -> ControlPlaneBinaries:
    """The cached binaries of `$K8S`, for tests that start a control plane of their own."""
    try:
        return cached_binaries(release(os.environ.get("K8S") or NEWEST))
    except ControlPlaneNotBuiltError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def control_plane(pytestconfig: pytest.Config) -> RealControlPlane:
    """The session's running control plane (kube-apiserver, scheduler, controller-manager)."""
    shared = pytestconfig.stash[_SESSION]
    if shared.failure:
        in_ci = os.environ.get("CI", "").lower() == "true"
        if in_ci or "did not start" in shared.failure:  # built but broken always fails
            pytest.fail(shared.failure, pytrace=False)
        pytest.skip(shared.failure)
    assert shared.background is not None
    return shared.background.plane


@pytest.fixture
async def admin(control_plane: RealControlPlane) -> AsyncIterator[KubeClient]:
    """A client of the session's control plane as the cluster admin."""
    client = await KubeClient.connect(control_plane.kube_settings())
    yield client
    await client.close()
