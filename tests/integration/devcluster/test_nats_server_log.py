"""A dev nats-server's whole log on disk: what a long run (`make scale`) keeps to find out
later why the servers dropped clients, where memory keeps only the first lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster.natscluster import NATSCluster
from devcluster.natsserver import NATSServerProcess

pytestmark = pytest.mark.integration

_READY = "Server is ready"


def test_a_server_appends_every_line_it_logs_to_its_log_file_across_restarts(
    short_tmp: Path,
) -> None:
    log_file = short_tmp / "logs" / "nats-server.log"
    server = NATSServerProcess(short_tmp / "store", log_file=log_file)
    server.start()
    try:
        server.restart()
    finally:
        server.stop()
    text = log_file.read_text()
    assert text.count(_READY) == 2
    assert server.log_text() in text


def test_a_cluster_keeps_each_servers_log_in_its_store_only_when_asked(short_tmp: Path) -> None:
    with NATSCluster(short_tmp / "kept", size=3, keep_logs=True):
        pass
    for index in range(3):
        assert _READY in (short_tmp / "kept" / f"n{index}" / "nats-server.log").read_text()
    with NATSCluster(short_tmp / "memory", size=3):
        pass
    assert not list((short_tmp / "memory").glob("n*/nats-server.log"))
