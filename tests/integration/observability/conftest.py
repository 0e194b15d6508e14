"""The observability tests' binaries: skipped without them, failed without them under CI=true."""

from __future__ import annotations

import pytest

from tests.integration.observability.promstack import Binaries, require_binaries


@pytest.fixture
def binaries() -> Binaries:
    """Prometheus, promtool and Alertmanager, looked up before any stack starts."""
    return require_binaries()
