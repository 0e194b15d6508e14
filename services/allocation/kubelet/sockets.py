"""The plugin's unix socket files: stale-file cleanup before binding, tight modes, removal.

Only filesystem work lives here; binding is the gRPC server's job (agent.py). Sockets are
owner-only (0o600): the kubelet runs as root. We only ever touch our own socket paths, so a
rolling-update sibling with other socket names is never disturbed. A socket file is stale only
when nobody answers a connect on it: a second instance started without `--rolling-update-uid`
has the same paths as the live one, and must fail rather than take them over. For the same
reason a socket is removed on the way out only when nobody serves on it any more.

gRPC unlinks the path it bound when it stops, whoever's file is there by then; so a server
binds a hidden staging path beside the socket (`staging_path`; the kubelet ignores dot-files)
and the bound socket is renamed into place (`publish`), owner-only from the start.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from pathlib import Path

import structlog

from shared import atomicfile
from shared.errors import SocketBindError

__all__ = [
    "SOCKET_MODE",
    "address",
    "clear_stale",
    "publish",
    "refuse_if_served",
    "remove",
    "restrict",
    "serving",
    "staging_path",
]

log = structlog.get_logger(__name__)

SOCKET_MODE = 0o600
_DIR_MODE = 0o750
_CONNECT_TIMEOUT_S = 0.5


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
    refuse_if_served(path)
    remove(path)
    log.info("stale_socket_removed", path=str(path))


def refuse_if_served(path: Path) -> None:
    """Raise SocketBindError when a process serves on the socket `path` (another instance)."""
    if serving(path):
        raise SocketBindError(
            f"socket {path}: another process is serving on it (a second plugin instance "
            "needs --rolling-update-uid)",
            path=str(path),
        )


def serving(path: Path) -> bool:
    """Whether a process accepts connections on the socket `path` (blocks up to 0.5 s).

    Only a refused connect, or no file, means nobody: a full backlog or a permission problem
    may hide a live server, whose socket must not be taken for stale."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(_CONNECT_TIMEOUT_S)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


def staging_path(path: Path) -> Path:
    """Where the socket for `path` is bound before `publish`: a dot-file beside it, no longer
    than its name where possible (socket paths are limited to 107 bytes), unique per process."""
    digest = hashlib.sha256(f"{path.name}/{os.getpid()}".encode()).hexdigest()
    return path.with_name("." + digest[: max(8, len(path.name) - 1)])


def publish(staged: Path, path: Path) -> None:
    """Rename the bound socket `staged` to `path`, unless another process serves there now."""
    refuse_if_served(path)
    try:
        os.replace(staged, path)
    except OSError as exc:
        raise SocketBindError(f"socket {path}: {exc}", path=str(path)) from exc


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
