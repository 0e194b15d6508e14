"""Whether new claims get device metadata files: `--device-metadata` auto/on/off.

`auto` asks the API server's `/version` once at start: Kubernetes 1.36 is the first release
whose in-container consumers (`k8s.io/dynamic-resource-allocation/devicemetadata`) read the
files. An answer that cannot be had or read leaves the feature off (logged): claims still
prepare, without the file.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import structlog

from shared.errors import KubeError, RecoverableError

__all__ = ["FIRST_MINOR", "VersionSource", "enabled", "minor_of"]

log = structlog.get_logger(__name__)

FIRST_MINOR = 36
_GIT_VERSION = re.compile(r"v?1\.([0-9]+)(\.|$)")


class VersionSource(Protocol):
    async def get_path(self, path: str) -> dict[str, Any]: ...


def minor_of(version: dict[str, Any]) -> int | None:
    """The 1.x minor of a `/version` answer (`minor` may read `36+`); None when unreadable."""
    if str(version.get("major", "")) == "1":
        digits = re.match(r"[0-9]+", str(version.get("minor", "")))
        if digits:
            return int(digits.group())
    match = _GIT_VERSION.match(str(version.get("gitVersion", "")))
    return int(match.group(1)) if match else None


async def enabled(mode: str, source: VersionSource) -> bool:
    if mode != "auto":
        return mode == "on"
    try:
        minor = minor_of(await source.get_path("/version"))
    except (KubeError, RecoverableError) as exc:
        log.warning("device_metadata_off", reason=f"server version unknown: {exc}")
        return False
    on = minor is not None and minor >= FIRST_MINOR
    log.info("device_metadata", enabled=on, server_minor=minor)
    return on
