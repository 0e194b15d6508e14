"""`python -m devcluster up --control-plane real`: the three agents as processes on the real control
plane, and `python -m devcluster claim` getting a pod scheduled by kube-scheduler and prepared."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from devcluster import workdir
from devcluster.claim import ClaimRequest, run_claim
from devcluster.controlplane import ControlPlaneBinaries
from devcluster.stack import StackConfig
from devcluster.up import run_up

pytestmark = pytest.mark.k8s


async def test_up_on_the_real_control_plane_prepares_a_scheduled_pod(
    control_plane_binaries: ControlPlaneBinaries, short_tmp: Path
):
    minor = control_plane_binaries.release.minor
    config = StackConfig(
        workdir=short_tmp, control_plane="real", kubernetes_version=minor, sim_profile="gpu"
    )
    stop, printed = asyncio.Event(), io.StringIO()
    up = asyncio.create_task(run_up(config, stop=stop, out=printed))
    try:
        async with asyncio.timeout(45):
            while workdir.read_endpoints(short_tmp) is None:
                assert not up.done(), printed.getvalue()
                await asyncio.sleep(0.1)
        assert "kube-apiserver" in printed.getvalue()
        said = io.StringIO()
        request = ClaimRequest(workdir=short_tmp, name="try", count=2)
        assert await run_claim(request, out=said) == 0
        lines = said.getvalue()
        assert "bound to demo-node by kube-scheduler and prepared" in lines
        assert "CDI spec" in lines
        cdi_specs = list((short_tmp / "cdi").glob("*.json"))
        assert len(cdi_specs) == 1
        released = io.StringIO()
        release = ClaimRequest(workdir=short_tmp, name="try", release=True)
        assert await run_claim(release, out=released) == 0
        assert not list((short_tmp / "cdi").glob("*.json"))
    finally:
        stop.set()
        code = await asyncio.wait_for(up, 30)
    assert code == 0, printed.getvalue()
