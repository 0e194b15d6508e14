"""The plugin's unix socket files: stale-file cleanup before binding, tight modes, removal.

Only filesystem work lives here; binding is the gRPC server's job (agent.py). Sockets are
owner-only (0o600): the kubelet runs as root. We only ever touch our own socket paths, so a
rolling-update sibling with other socket names is never disturbed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import structlog

from shared import atomicfile
from shared.errors import SocketBindError

__all__ = ["SOCKET_MODE", "address", "clear_stale", "remove", "restrict"]

log = structlog.get_logger(__name__)

SOCKET_MODE = 0o600
_DIR_MODE = 0o750


def address(path: Path) -> str:
    """The gRPC target of a unix socket path (`unix:///abs/path`)."""
    return f"unix://{path}"


def clear_stale(path: Path) -> None:
    """Create the socket's directory and remove a socket file left by an earlier run.

    Anything at `path` that is not a socket is left alone and reported: binding over a regular
    file would destroy data that is not ours.
    """
    try:
        atomicfile.make_dirs(path.parent, mode=_DIR_MODE)
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SocketBindError(f"socket {path}: {exc}", path=str(path)) from exc
    if not stat.S_ISSOCK(mode):
        raise SocketBindError(f"socket {path}: exists and is not a socket", path=str(path))
    remove(path)
    log.info("stale_socket_removed", path=str(path))


def restrict(path: Path) -> None:
    """Make a freshly bound socket owner-only."""
    try:
        os.chmod(path, SOCKET_MODE)
    except OSError as exc:
        raise SocketBindError(f"socket {path}: chmod: {exc}", path=str(path)) from exc


def remove(path: Path) -> None:
    """Remove our socket file; a missing file is fine (removal is idempotent)."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("socket_remove_failed", path=str(path), error=str(exc))
