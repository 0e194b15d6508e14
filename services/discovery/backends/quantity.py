"""Byte counts as canonical Kubernetes quantities (pure): what the API server would store.

`85899345920` bytes is `80Gi`, `85520809984` is `81559Mi`: the largest binary suffix that
divides the count, so that a re-read slice compares equal to what was sent.
"""

from __future__ import annotations

__all__ = ["binary", "mebibytes"]

_SUFFIXES = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))


def binary(n_bytes: int) -> str:
    """A non-negative byte count with the largest binary suffix that divides it."""
    if n_bytes < 0:
        raise ValueError(f"negative byte count {n_bytes}")
    for suffix, shift in _SUFFIXES:
        if n_bytes and n_bytes % (1 << shift) == 0:
            return f"{n_bytes >> shift}{suffix}"
    return str(n_bytes)


def mebibytes(n_mib: int) -> str:
    """A MiB count (what NVML's `memorySizeMB` and npu-smi's `MB` really are) as a quantity."""
    return binary(n_mib << 20)
