"""The device metadata files of prepared claims under `<plugin data dir>/dra-device-metadata`.

One file per request of a claim, `<uid>_<request>.json`, each written atomically (a runtime
never reads half a file). The preparer writes them before the CDI spec that mounts them and
removes them after the spec at unprepare; recovery removes temporaries and the files of claims
without a record. Claims prepared before this flat layout keep theirs at
`<uid>/<request>/metadata.json`, where their stored CDI spec mounts them: every call that
places a file takes the claim's spec, and a file goes where the spec mounts it.

`durable=False` (the agent's choice) skips the fsyncs: after a power loss a file may be empty,
and a removed one may be back. Recovery then compares every file of a completed claim with its
record (`matches`) and rewrites it, and removes the files of claims without a record; the
reboot that comes with a power loss also wipes the CDI specs under /var/run/cdi, which are
rewritten with them.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from services.allocation.metadata import document
from shared import atomicfile

__all__ = ["MetadataFiles"]

_FILE_MODE = 0o644  # read by the container's user, whoever that is; holds no secret
_LEGACY_DIR_MODE = 0o755

Spec = Mapping[str, Any] | None
"""A claim's CDI spec, which mounts its metadata files (None: plan a new claim's layout)."""


class MetadataFiles:
    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.root = root
        self.durable = durable

    @property
    def mount_root(self) -> PurePosixPath:
        """The directory every mount of a metadata file must come from (the allowlist's root)."""
        return PurePosixPath(self.root)

    def path(self, claim_uid: str, request: str, spec: Spec = None) -> Path:
        """Where the request's file is: the legacy place when `spec` mounts it from there."""
        legacy = document.legacy_host_path(self.mount_root, claim_uid=claim_uid, request=request)
        if str(legacy) in document.mounted_host_paths(spec):
            return Path(legacy)
        return Path(document.host_path(self.mount_root, claim_uid=claim_uid, request=request))

    def encoded(
        self, claim_uid: str, bodies: Mapping[str, Mapping[str, Any]], spec: Spec = None
    ) -> list[tuple[Path, bytes]]:
        """Each request's file and its bytes (`bodies`: request -> version-less document), for
        `write_blocking`."""
        return [
            (self.path(claim_uid, request, spec), document.encode_stream(body))
            for request, body in bodies.items()
        ]

    def write_blocking(self, files: Iterable[tuple[Path, bytes]]) -> None:
        """Write `encoded` files; blocking, for a worker thread."""
        atomicfile.make_dirs(self.root, mode=_LEGACY_DIR_MODE)
        for path, data in files:
            if path.parent != self.root:
                atomicfile.make_dirs(path.parent, mode=_LEGACY_DIR_MODE)
            if self.durable:
                atomicfile.write_atomic(path, data, mode=_FILE_MODE)
            else:
                atomicfile.write_and_rename(path, data, mode=_FILE_MODE, sync=False)

    def complete(self, claim_uid: str, requests: Mapping[str, Any], spec: Spec = None) -> bool:
        """Whether the file of every request in `requests` exists."""
        return all(self.path(claim_uid, request, spec).is_file() for request in requests)

    def matches(
        self, claim_uid: str, bodies: Mapping[str, Mapping[str, Any]], spec: Spec = None
    ) -> bool:
        """Whether every request's file holds exactly its document (at start: a power loss
        may have left a file empty when it was not written durably)."""
        for path, data in self.encoded(claim_uid, bodies, spec):
            try:
                if path.read_bytes() != data:
                    return False
            except OSError:
                return False
        return True

    async def remove(
        self, claim_uid: str, requests: Iterable[str] | None = None, spec: Spec = None
    ) -> bool:
        """Remove the claim's files; False when there were none. `requests` (with the claim's
        spec) names them; None (a claim without a record) looks for them in the directory."""
        return await asyncio.to_thread(self._remove, claim_uid, requests, spec)

    def _remove(self, claim_uid: str, requests: Iterable[str] | None, spec: Spec) -> bool:
        if requests is None:
            paths = self._found(claim_uid)
        else:
            paths = [self.path(claim_uid, request, spec) for request in requests]
        removed = False
        for path in paths:
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            removed = True
        legacy = self.root / claim_uid
        if legacy.is_dir():
            shutil.rmtree(legacy)
            removed = True
        if removed and self.durable:
            atomicfile.fsync_dir(self.root)
        return removed

    def _found(self, claim_uid: str) -> list[Path]:
        if not self.root.is_dir():
            return []
        return list(self.root.glob(f"{claim_uid}{document.HOST_SEPARATOR}*.json"))

    def claim_uids(self) -> list[str]:
        """UIDs of the claims that have files here, in either layout."""
        if not self.root.is_dir():
            return []
        uids = set()
        for path in self.root.iterdir():
            if path.is_dir():
                uids.add(path.name)
            elif path.suffix == ".json" and not path.name.startswith("."):
                uids.add(path.name.partition(document.HOST_SEPARATOR)[0])
        return sorted(uids)

    def remove_temporaries(self) -> list[Path]:
        """Half-written files a crash left (`.<name>.tmp-<pid>`, in either layout); at start
        only."""
        if not self.root.is_dir():
            return []
        removed = sorted([*self.root.glob(".*.tmp-*"), *self.root.glob("*/*/.*.tmp-*")])
        for path in removed:
            atomicfile.remove(path)
        return removed
