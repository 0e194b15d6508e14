"""Socket files of the plugin: a live one (another instance serving on it) is never removed,
neither as "stale" before binding nor on the way out; a dead one left by a crash is."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from services.allocation.kubelet import socket_server, sockets
from shared.errors import SocketBindError


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory short enough for unix socket paths (107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="dra-sock-", dir="/tmp") as name:
        yield Path(name)


def _listening(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    return server


def _dead(path: Path) -> None:
    """A socket file whose process is gone: bound, then closed without unlinking it."""
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(str(path))
    leftover.close()


def test_a_live_socket_is_not_stale(short_dir):
    path = short_dir / "dra.sock"
    with _listening(path):
        with pytest.raises(SocketBindError, match="another process is serving on it"):
            sockets.clear_stale(path)
        assert path.is_socket()


def test_a_dead_socket_is_removed_before_binding(short_dir):
    path = short_dir / "dra.sock"
    _dead(path)
    sockets.clear_stale(path)
    assert not path.exists()


def _no_services(server: grpc.aio.Server) -> None:
    pass


async def test_stopping_leaves_a_socket_that_another_process_now_serves(short_dir):
    path = short_dir / "dra.sock"
    server = await socket_server.start(path, _no_services)
    # Another instance took the path over (removed ours as stale and bound its own).
    path.unlink()
    with _listening(path):
        await socket_server.stop(server, path, grace_s=0)
        assert path.is_socket()


async def test_stopping_removes_our_own_socket(short_dir):
    path = short_dir / "dra.sock"
    server = await socket_server.start(path, _no_services)
    await socket_server.stop(server, path, grace_s=0)
    assert not path.exists()
