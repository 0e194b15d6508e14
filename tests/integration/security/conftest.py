"""Fixtures of the NATS security tests: the PKI, private servers that demand credentials or
certificates, and the Bus's log events as structlog produced them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from devcluster.natsauth import ServerAuth
from devcluster.natsserver import NATSServerProcess
from tests.integration.security.secure_nats import PKI


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def secured_nats(tmp_path: Path) -> Iterator[Callable[[ServerAuth], NATSServerProcess]]:
    """Start a private nats-server that demands what `auth` says; stopped after the test."""
    started: list[NATSServerProcess] = []

    def start(auth: ServerAuth) -> NATSServerProcess:
        server = NATSServerProcess(tmp_path / f"nats-{len(started)}", auth=auth)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def bus_events() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every structlog event of the test, as the code emitted it (before any redaction)."""
    with structlog.testing.capture_logs() as events:
        yield events
