"""The VFIO ledger: which PCI functions this agent moved to vfio-pci, for which claim, and the
driver and `driver_override` each had before (`<plugin data dir>/vfio-bindings.json`).

The binder writes a function's entry, durably, before its first sysfs write, and removes it
only once the function is back on its original driver, so that a process killed at any step
finds at its next start what it may have changed, and only that: functions no entry names
(an administrator's vfio-pci bindings) are never touched. The file is a versioned JSON
document, replaced atomically (`shared.atomicfile`); an unreadable one fails the claim at hand,
never guessed at or overwritten.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog

from shared import atomicfile
from shared.errors import ClaimError
from shared.vfio import pci

__all__ = ["API_VERSION", "KIND", "Binding", "VfioLedger"]

log = structlog.get_logger(__name__)

API_VERSION = "dra-suite.io/v1"
KIND = "VfioBindings"
# A driver name becomes a path segment (`drivers/<name>/bind`): a kernel module's name.
_DRIVER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", re.ASCII)


@dataclass(frozen=True, slots=True, kw_only=True)
class Binding:
    """One PCI function bound (or being bound) to vfio-pci for a claim."""

    claim_uid: str
    device: str
    """The inventory device the function belongs to."""
    bdf: str
    iommu_group: int
    original_driver: str | None
    """The driver it had before the claim; None: unbound."""
    original_override: str | None
    """Its `driver_override` before the claim; None: unset."""


_FIELDS = {
    "claim_uid": "claimUID",
    "device": "device",
    "bdf": "bdf",
    "iommu_group": "iommuGroup",
    "original_driver": "originalDriver",
    "original_override": "originalOverride",
}


def _encode(binding: Binding) -> dict[str, Any]:
    return {_FIELDS[k]: v for k, v in asdict(binding).items()}


def _optional_driver(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _DRIVER.fullmatch(value):
        raise ValueError(f"driver name {str(value)[:64]!r}")
    return value


def _decode(entry: Any) -> Binding:
    if not isinstance(entry, dict):
        raise TypeError("an entry is not an object")
    bdf = str(entry["bdf"])
    if not pci.is_bdf(bdf):
        raise ValueError(f"PCI address {bdf[:32]!r}")
    group = entry["iommuGroup"]
    if not isinstance(group, int) or isinstance(group, bool):
        raise TypeError("iommuGroup is not an integer")
    return Binding(
        claim_uid=str(entry["claimUID"]),
        device=str(entry["device"]),
        bdf=bdf,
        iommu_group=group,
        original_driver=_optional_driver(entry.get("originalDriver")),
        original_override=_optional_driver(entry.get("originalOverride")),
    )


class VfioLedger:
    """`path` on disk; every read goes to the file (another plugin instance may have written
    it, under the instance lock), every write is durable."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, claim_uid: str = "") -> list[Binding]:
        """Every entry (blocking); ClaimError for `claim_uid` when the file is unreadable."""
        try:
            document = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise ClaimError(f"VFIO ledger {self.path}: {exc}", claim_uid=claim_uid) from exc
        try:
            if not isinstance(document, dict) or document.get("kind") != KIND:
                raise ValueError(f"not a {KIND} document")
            return [_decode(entry) for entry in document["bindings"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ClaimError(
                f"VFIO ledger {self.path}: malformed ({type(exc).__name__}: {exc})",
                claim_uid=claim_uid,
            ) from exc

    def write(self, bindings: Sequence[Binding], claim_uid: str = "") -> None:
        """Replace the file atomically and durably (blocking); ClaimError when it fails. An
        empty ledger removes the file."""
        try:
            atomicfile.make_dirs(self.path.parent, mode=0o750)
            for leftover in atomicfile.remove_temporaries(self.path):
                log.warning("temporary_file_removed", path=str(leftover))
            if not bindings:
                atomicfile.remove(self.path)
                return
            document = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "bindings": [_encode(b) for b in bindings],
            }
            atomicfile.write_atomic(self.path, json.dumps(document, indent=2).encode())
        except OSError as exc:
            raise ClaimError(
                f"VFIO ledger {self.path}: writing: {exc}", claim_uid=claim_uid
            ) from exc
