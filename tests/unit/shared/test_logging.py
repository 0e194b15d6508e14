"""Logs are JSON lines, with the trace and span IDs of the span they are written in."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider

from shared.config import LogSettings
from shared.logging import configure


@pytest.fixture
def json_logs(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """JSON logging to the test's captured stderr, undone afterwards.

    Configured from inside the test call (see `_configure`): the logger factory binds the
    sys.stderr that is current then, and capsys swaps it between setup and call.
    """
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    logging.getLogger().handlers.clear()  # its stream was the test's captured stderr


def _configure() -> None:
    configure(LogSettings(level="info", format="json"), service="test")


def _lines(captured: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in captured.splitlines() if line.startswith("{")]


def test_a_line_inside_a_span_carries_its_trace_and_span_ids(json_logs, capsys):
    _configure()
    tracer = TracerProvider().get_tracer("test")
    log = structlog.get_logger("test")
    with tracer.start_as_current_span("work") as span:
        log.info("claim_prepared", claim_uid="u-1")
    context = span.get_span_context()
    [line] = _lines(capsys.readouterr().err)
    assert line["event"] == "claim_prepared"
    assert line["claim_uid"] == "u-1"
    assert line["service"] == "test"
    assert line["trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")


def test_a_line_outside_any_span_has_no_trace_id(json_logs, capsys):
    _configure()
    structlog.get_logger("test").warning("nats_disconnected")
    [line] = _lines(capsys.readouterr().err)
    assert line["level"] == "warning"
    assert "trace_id" not in line


def test_exception_lines_carry_no_frame_locals(json_logs, capsys):
    _configure()
    secret = "nats-password-123"
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        structlog.get_logger("test").exception("agent_failed")
    assert secret not in capsys.readouterr().err


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_no_secret_reaches_a_log_line(json_logs, capsys, log_format):
    configure(LogSettings(level="info", format=log_format), service="test")
    password, token = "pw-9f8e7d6c", "tok-1a2b3c4d"
    log = structlog.get_logger("test")
    log.info("nats_connecting", servers=f"nats://agent:{password}@nats:4222")
    log.info("config", nats={"user": "agent", "password": password, "token": token})
    log.warning("retry", nats_token=token, token_file="/etc/dra-suite/nats/token")
    try:
        raise ConnectionError(f"cannot reach nats://agent:{password}@nats:4222")
    except ConnectionError:
        log.exception("agent_failed")
    logging.getLogger("nats.aio.client").error("lost tls://%s@nats:4222", token)
    err = capsys.readouterr().err
    assert password not in err
    assert token not in err
    assert "/etc/dra-suite/nats/token" in err  # where the secret lives is no secret
    assert err.count("[REDACTED]") >= 6


def test_asyncios_tls_eof_warning_is_dropped_and_other_warnings_kept(json_logs, capsys):
    _configure()
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.warning("returning true from eof_received() has no effect when using ssl")
    asyncio_log.warning("Executing <Task> took 0.5 seconds")
    [line] = _lines(capsys.readouterr().err)
    assert line["event"] == "Executing <Task> took 0.5 seconds"
