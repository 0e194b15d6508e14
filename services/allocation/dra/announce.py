"""Tells several sinks of each completed prepare and unprepare (the prepared-claims KV, the
claim's device status); each call returns at once, as every sink's does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.allocation.claim.checkpoint import PreparedClaim
from services.allocation.claim.claims import PodRef
from services.allocation.dra.preparer import PreparedClaimSink

__all__ = ["Announcers"]


class Announcers:
    def __init__(self, *sinks: PreparedClaimSink) -> None:
        self._sinks = sinks

    def prepared(
        self,
        record: PreparedClaim,
        *,
        pods: Sequence[PodRef] | None,
        resource: Mapping[str, Any] | None = None,
    ) -> None:
        for sink in self._sinks:
            sink.prepared(record, pods=pods, resource=resource)

    def unprepared(self, uid: str) -> None:
        for sink in self._sinks:
            sink.unprepared(uid)
