"""Fuzzing the agents' input surfaces: the kubelet's gRPC calls and every NATS subject and KV key.

The agents run in-process exactly as in their own integration tests, so this folder reuses
their harnesses as fixtures: `plugin_node` (the allocation agent's node) and `health` (the
health agent). `fuzzing.py` holds the hypothesis settings, strategies and helpers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from tests.integration.allocation.conftest import plugin_node
from tests.integration.fuzz.fuzzing import Logs
from tests.integration.health.conftest import health

__all__ = ["health", "logs", "plugin_node"]


@pytest.fixture
def logs() -> Iterator[Logs]:
    """Every structlog event of the test, as the agents emitted it."""
    with structlog.testing.capture_logs() as events:
        yield Logs(events)
