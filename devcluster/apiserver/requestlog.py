"""A bounded, in-memory log of every API request, for tests to count calls and writes.

Records are appended when a request starts and get their status when it ends
(a watch is logged while it streams). Never logs `/_emulator` control calls.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["WRITE_VERBS", "RequestLog", "RequestRecord"]

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(slots=True, kw_only=True)
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    verb: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    status: int = 0
    """HTTP status; 0 while the request is still running."""
    timestamp: float = 0.0
    """Wall-clock start time (time.time())."""
    duration_s: float = 0.0
    fault: bool = False
    """True when an injected fault produced the response."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RequestLog:
    def __init__(self, *, maxlen: int = 100_000) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=maxlen)

    def append(self, record: RequestRecord) -> None:
        self._records.append(record)

    def records(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        subresource: str | None = None,
        name: str | None = None,
        method: str | None = None,
        status: int | None = None,
    ) -> list[RequestRecord]:
        """Records matching every filter given (None = any)."""
        wanted = {
            "verb": verb, "resource": resource, "subresource": subresource,
            "name": name, "method": method, "status": status,
        }  # fmt: skip
        filters = [(k, v) for k, v in wanted.items() if v is not None]
        return [r for r in self._records if all(getattr(r, k) == v for k, v in filters)]

    def count(self, **filters: Any) -> int:
        """`count(verb="create", resource="resourceslices")`; same filters as `records`."""
        return len(self.records(**filters))

    def writes(self, resource: str | None = None) -> list[RequestRecord]:
        """Create/update/patch/delete/deletecollection requests, optionally for one resource."""
        records = self.records(resource=resource)
        return [r for r in records if r.verb in WRITE_VERBS]

    def clear(self) -> None:
        self._records.clear()

    def __len__(self) -> int:
        return len(self._records)

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self._records]
