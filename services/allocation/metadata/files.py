"""The device metadata files of prepared claims under `<plugin data dir>/dra-device-metadata`.

One directory per claim UID, one file per request (`<uid>/<request>/metadata.json`), each
written atomically (a runtime never reads half a file). The preparer writes them before the CDI
spec that mounts them and removes them after the spec at unprepare; recovery removes
temporaries and the directories of claims without a record.

`durable=False` (the agent's choice) skips the fsyncs: after a power loss a file may be empty,
and a removed directory may be back. Recovery then compares every file of a completed claim
with its record (`matches`) and rewrites it, and removes the directories of claims without a
record; the reboot that comes with a power loss also wipes the CDI specs under /var/run/cdi,
which are rewritten with them.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from services.allocation.metadata import document
from shared import atomicfile

__all__ = ["MetadataFiles"]

_FILE_MODE = 0o644  # read by the container's user, whoever that is; holds no secret
_DIR_MODE = 0o755


class MetadataFiles:
    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.root = root
        self.durable = durable

    @property
    def mount_root(self) -> PurePosixPath:
        """The directory every mount of a metadata file must come from (the allowlist's root)."""
        return PurePosixPath(self.root)

    def path(self, claim_uid: str, request: str) -> Path:
        return Path(document.host_path(self.mount_root, claim_uid=claim_uid, request=request))

    async def write(self, claim_uid: str, bodies: Mapping[str, Mapping[str, Any]]) -> None:
        """Write the file of each request (`bodies`: request -> version-less document)."""
        if bodies:
            await asyncio.to_thread(self._write, claim_uid, bodies)

    def _write(self, claim_uid: str, bodies: Mapping[str, Mapping[str, Any]]) -> None:
        for request, body in bodies.items():
            path = self.path(claim_uid, request)
            atomicfile.make_dirs(path.parent, mode=_DIR_MODE)
            data = document.encode_stream(body)
            if self.durable:
                atomicfile.write_atomic(path, data, mode=_FILE_MODE)
            else:
                atomicfile.write_and_rename(path, data, mode=_FILE_MODE, sync=False)

    def complete(self, claim_uid: str, requests: Mapping[str, Any]) -> bool:
        """Whether the file of every request in `requests` exists."""
        return all(self.path(claim_uid, request).is_file() for request in requests)

    def matches(self, claim_uid: str, bodies: Mapping[str, Mapping[str, Any]]) -> bool:
        """Whether every request's file holds exactly its document (at start: a power loss
        may have left a file empty when it was not written durably)."""
        for request, body in bodies.items():
            try:
                if self.path(claim_uid, request).read_bytes() != document.encode_stream(body):
                    return False
            except OSError:
                return False
        return True

    async def remove(self, claim_uid: str) -> bool:
        """Remove the claim's directory; False when there was none."""
        return await asyncio.to_thread(self._remove, claim_uid)

    def _remove(self, claim_uid: str) -> bool:
        directory = self.root / claim_uid
        if not directory.exists():
            return False
        shutil.rmtree(directory)
        if self.durable:
            atomicfile.fsync_dir(self.root)
        return True

    def claim_uids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def remove_temporaries(self) -> list[Path]:
        """Half-written files a crash left (`.metadata.json.tmp-<pid>`); at start only."""
        if not self.root.is_dir():
            return []
        removed = sorted(self.root.glob("*/*/.*.tmp-*"))
        for path in removed:
            atomicfile.remove(path)
        return removed
