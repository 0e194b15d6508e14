"""A recording stand-in for the evaluator's Node Event writer and alert publisher."""

from __future__ import annotations

from typing import Any


class Sink:
    """Keeps what it is given, Events (`emit`) and alerts (`publish`) alike."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def emit(self, item: Any, **_: Any) -> None:
        self.sent.append(item)

    def publish(self, item: Any, **_: Any) -> None:
        self.sent.append(item)
