"""The record of partitions a hardware partition manager made: a versioned JSON file, atomic.

The MIG and vNPU managers write one entry per (claim UID, device) here *before* they ask the
hardware for a partition, and complete it after, so a process killed in between finds at its
next start what it may have made, and only that: partitions no entry names (an admin's) are
never touched. Entries are JSON objects owned by the manager; this module only reads and
writes the list. An unreadable file fails the claim at hand, never guessed at or overwritten.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog

from shared import atomicfile
from shared.errors import ClaimError
from shared.vendors.parts.partitions import Partition

__all__ = ["API_VERSION", "MALFORMED", "Entry", "StateFile", "to_partition"]

log = structlog.get_logger(__name__)

API_VERSION = "dra-suite.io/v1"
Entry = dict[str, Any]
MALFORMED = (KeyError, TypeError, ValueError)
"""What reading a field of a hand-edited (or foreign) entry may raise; see `StateFile.malformed`."""


class StateFile:
    """`<plugin data dir>/<name>.json`, a `{apiVersion, kind, partitions: [...]}` document."""

    def __init__(self, path: Path, *, kind: str) -> None:
        self.path = path
        self.kind = kind

    def read(self, claim_uid: str) -> list[Entry]:
        """The entries on disk (blocking); ClaimError for `claim_uid` when unreadable."""
        try:
            document = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise ClaimError(f"partition state {self.path}: {exc}", claim_uid=claim_uid) from exc
        if not isinstance(document, dict):
            document = {}
        entries = document.get("partitions")
        if document.get("kind") != self.kind or not isinstance(entries, list):
            raise ClaimError(
                f"partition state {self.path} is not a {self.kind} document", claim_uid=claim_uid
            )
        if not all(isinstance(e, dict) and {"claimUID", "device"} <= e.keys() for e in entries):
            raise ClaimError(
                f"partition state {self.path}: an entry lacks claimUID or device",
                claim_uid=claim_uid,
            )
        return entries

    def malformed(self, claim_uid: str, exc: Exception) -> ClaimError:
        """The claim's error for an entry that lacks a field or has one of the wrong type."""
        return ClaimError(
            f"partition state {self.path}: malformed entry ({type(exc).__name__}: {exc})",
            claim_uid=claim_uid,
        )

    def write(self, entries: list[Entry], claim_uid: str) -> None:
        """Replace the file atomically (blocking); ClaimError for `claim_uid` when it fails."""
        document = {"apiVersion": API_VERSION, "kind": self.kind, "partitions": entries}
        data = json.dumps(document, indent=2, sort_keys=True).encode()
        try:
            atomicfile.make_dirs(self.path.parent, mode=0o750)
            # Writes are serialized (manager lock, instance lock): any temp file is a killed
            # writer's, never one in flight.
            for leftover in atomicfile.remove_temporaries(self.path):
                log.warning("temporary_file_removed", path=str(leftover))
            atomicfile.write_atomic(self.path, data)
        except OSError as exc:
            raise ClaimError(
                f"partition state {self.path}: writing: {exc}", claim_uid=claim_uid
            ) from exc


def to_partition(entry: Entry) -> Partition:
    """The `Partition` an entry describes (`id` is empty until the hardware made it)."""
    return Partition(
        claim_uid=str(entry["claimUID"]),
        device=str(entry["device"]),
        profile=str(entry.get("profile", "")),
        id=str(entry.get("id") or ""),
        env={str(k): str(v) for k, v in dict(entry.get("env") or {}).items()},
        device_nodes=tuple((str(p), str(h)) for p, h in entry.get("deviceNodes") or ()),
    )
