"""Fixtures of the reliability suite: a whole node (LocalStack) per test, ready to be hurt.

`node` starts nats-server, the API emulator and the three agents as processes with a copied
sim profile (hot-plug by rewriting it), waits until the slices match the profile and a kubelet
registered the plugin, and yields a `ReliabilityNode`. At the end it checks that no agent
died unnoticed and stops the stack.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.stack import LocalStack, StackConfig
from shared.bus.session import open_bus
from tests.reliability.emulator_control import EmulatorControl
from tests.reliability.harness import DRIVER, NODE, SHIPPED, ReliabilityNode

KEEP_LOGS_ENV = "DRA_SUITE_KEEP_LOGS"
"""A directory: each test's agent logs are copied to `<dir>/<test name>/` (CI artifacts)."""


@pytest.fixture
async def node(short_tmp: Path, request: pytest.FixtureRequest) -> AsyncIterator[ReliabilityNode]:
    profile = short_tmp / "profile.yaml"
    shutil.copyfile(SHIPPED, profile)
    # Indirect parametrization overrides StackConfig fields: {"extra_args": ...}.
    changes: dict[str, Any] = getattr(request, "param", {})
    config = StackConfig(
        workdir=short_tmp / "stack",
        node_name=NODE,
        driver_name=DRIVER,
        sim_profile=str(profile),
        recovery_hold_s=0.5,
        **changes,
    )
    async with LocalStack(config) as stack, _logs_kept(config, request.node.name):
        async with (
            open_bus(stack.nats_settings) as bus,
            stack.kube() as kube,
            EmulatorControl(stack.api_url) as api,
        ):
            reliability_node = ReliabilityNode(
                stack=stack, bus=bus, kube=kube, api=api, profile=profile
            )
            try:
                await reliability_node.wait_ready()
                yield reliability_node
            finally:
                await reliability_node.forget_kubelet()
        assert stack.exited_agents() == {}


@contextlib.asynccontextmanager
async def _logs_kept(config: StackConfig, test: str) -> AsyncIterator[None]:
    try:
        yield
    finally:
        if keep := os.environ.get(KEEP_LOGS_ENV):
            shutil.copytree(config.logs_dir, Path(keep) / test, dirs_exist_ok=True)
