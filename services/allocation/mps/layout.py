"""Where a claim's MPS daemon keeps its pipe and log directories, and the CDI edits that give
them to the claim's containers (pure).

On the host: `<plugin data dir>/mps/<claim UID>/{pipe,log}`, strictly under the driver's own
`mps` root, which is the root the allowlist admits these mounts from. In the container: the
pipe directory read-write at `/tmp/nvidia-mps` (a client connects to the daemon's socket
there), the log directory read-only at `/var/log/nvidia-mps`; the two `CUDA_MPS_*_DIRECTORY`
variables name exactly those paths, and the allowlist accepts no other value.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

__all__ = [
    "CONTAINER_LOG_DIR",
    "CONTAINER_PIPE_DIR",
    "LOG_DIR_ENV",
    "PIPE_DIR_ENV",
    "container_env",
    "host_dirs",
    "mounts",
]

PIPE_DIR_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_DIR_ENV = "CUDA_MPS_LOG_DIRECTORY"
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
CONTAINER_LOG_DIR = "/var/log/nvidia-mps"


def host_dirs(root: PurePosixPath, claim_uid: str) -> tuple[PurePosixPath, PurePosixPath]:
    """(pipe directory, log directory) of the claim's daemon on the host."""
    return root / claim_uid / "pipe", root / claim_uid / "log"


def container_env() -> dict[str, str]:
    return {PIPE_DIR_ENV: CONTAINER_PIPE_DIR, LOG_DIR_ENV: CONTAINER_LOG_DIR}


def mounts(root: PurePosixPath, claim_uid: str) -> tuple[dict[str, Any], ...]:
    pipe, log = host_dirs(root, claim_uid)
    return (
        {
            "hostPath": str(pipe),
            "containerPath": CONTAINER_PIPE_DIR,
            "options": ["rbind", "nosuid", "nodev", "noexec"],
        },
        {
            "hostPath": str(log),
            "containerPath": CONTAINER_LOG_DIR,
            "options": ["ro", "rbind", "nosuid", "nodev", "noexec"],
        },
    )
