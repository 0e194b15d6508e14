"""Fault injection: rules that make matching requests fail, slow down, or cut watch streams.

A rule matches on method/verb/resource/subresource/name/namespace (None = any) and
fires `times` times (None = forever) with `probability`. Decisions only; the HTTP
layer applies them.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from devcluster.apiserver.routing import RequestInfo

__all__ = ["Decision", "FaultRule", "Faults"]


@dataclass(slots=True, kw_only=True)
class FaultRule:
    method: str | None = None
    verb: str | None = None
    resource: str | None = None
    subresource: str | None = None
    name: str | None = None
    namespace: str | None = None
    status: int | None = None
    """HTTP error to answer with (e.g. 500, 429, 409); None = do not fail."""
    message: str = "injected fault"
    retry_after_s: int = 1
    """Retry-After header value for 429."""
    latency_s: float = 0.0
    """Delay before the request is handled (or fails)."""
    cut_watch_after_s: float | None = None
    """For watches: end the stream this many seconds after it starts."""
    times: int | None = None
    """How many more times the rule fires; None = unlimited."""
    probability: float = 1.0
    id: int = 0
    hits: int = 0

    def matches(self, info: RequestInfo) -> bool:
        pairs = (
            (self.method, info.method), (self.verb, info.verb),
            (self.resource, info.resource), (self.subresource, info.subresource),
            (self.name, info.name), (self.namespace, info.namespace),
        )  # fmt: skip
        return all(want is None or want == got for want, got in pairs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FaultRule:
        known = {f.name for f in fields(cls)} - {"id", "hits"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown fault rule fields: {', '.join(unknown)}")
        return cls(**data)


@dataclass(slots=True)
class Decision:
    """What the fired rules want done with one request."""

    latency_s: float = 0.0
    error: FaultRule | None = None
    cut_watch_after_s: float | None = None
    fired: list[int] = field(default_factory=list)


class Faults:
    def __init__(self, *, seed: int | None = None) -> None:
        self._rules: list[FaultRule] = []
        self._ids = itertools.count(1)
        self._random = random.Random(seed)

    def add(self, rule: FaultRule | None = None, **kwargs: Any) -> FaultRule:
        """Add `rule`, or one built from keyword arguments: `add(verb="create", status=500, times=2)`."""  # noqa: E501
        rule = rule if rule is not None else FaultRule(**kwargs)
        rule.id = next(self._ids)
        self._rules.append(rule)
        return rule

    def remove(self, rule_id: int) -> bool:
        before = len(self._rules)
        self._rules = [r for r in self._rules if r.id != rule_id]
        return len(self._rules) != before

    def clear(self) -> None:
        self._rules.clear()

    @property
    def rules(self) -> list[FaultRule]:
        return list(self._rules)

    def decide(self, info: RequestInfo) -> Decision:
        decision = Decision()
        for rule in self._rules:
            if not rule.matches(info) or (rule.times is not None and rule.times <= 0):
                continue
            if rule.probability < 1.0 and self._random.random() >= rule.probability:
                continue
            if rule.times is not None:
                rule.times -= 1
            rule.hits += 1
            decision.fired.append(rule.id)
            decision.latency_s += rule.latency_s
            if rule.status is not None and decision.error is None:
                decision.error = rule
            if rule.cut_watch_after_s is not None:
                current = decision.cut_watch_after_s
                cut = rule.cut_watch_after_s
                decision.cut_watch_after_s = cut if current is None else min(current, cut)
        return decision
