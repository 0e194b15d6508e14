"""structlog JSON logging with the current OpenTelemetry trace and span IDs on every line.

Events are constant snake_case strings; data goes in key-value pairs. The standard library's
loggers (nats, grpc, aiohttp) are routed through the same renderer at WARNING and above.
Every line passes `redact_secrets`: secret-looking keys and URL userinfo never reach the output.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog
from opentelemetry import trace

from shared.config import LogSettings
from shared.redaction import redact

__all__ = ["configure", "redact_secrets"]


def _add_trace_ids(_: Any, __: str, event: structlog.types.EventDict) -> structlog.types.EventDict:
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event.setdefault("trace_id", format(context.trace_id, "032x"))
        event.setdefault("span_id", format(context.span_id, "016x"))
    return event


def redact_secrets(_: Any, __: str, event: structlog.types.EventDict) -> structlog.types.EventDict:
    """Mask values of secret-looking keys and URL userinfo (`nats://user:pass@host`).

    Runs last before rendering, after the exception renderer, so tracebacks are covered too.
    """
    return {key: redact(value, key=key) for key, value in event.items()}


def _drop_tls_eof_noise(record: logging.LogRecord) -> bool:
    """asyncio warns at every close of a nats-py TLS connection (its protocol returns True
    from eof_received); against a server refusing us that is several lines a second."""
    return not (
        record.name == "asyncio" and record.getMessage().startswith("returning true from eof")
    )


def configure(settings: LogSettings, *, service: str) -> None:
    """Configure structlog (and stdlib logging) for one agent process."""
    level = getattr(logging, settings.level.upper())
    shared_processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_trace_ids,
    ]
    renderer: structlog.types.Processor
    if settings.format == "json":
        renderer = structlog.processors.JSONRenderer()
        # No frame locals: a crash must never print the config (NATS passwords, tokens).
        shared_processors.append(
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            )
        )
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
        # A plain traceback, rendered before redaction: the console renderer's default (rich)
        # would print every frame's locals, the config with its secrets among them.
        shared_processors.append(structlog.processors.format_exc_info)
    shared_processors.append(redact_secrets)
    structlog.configure(
        processors=[*shared_processors, structlog.processors.UnicodeDecoder(), renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=shared_processors,
        )
    )
    handler.addFilter(_drop_tls_eof_noise)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(level, logging.WARNING))
