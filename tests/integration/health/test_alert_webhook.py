"""The optional Alertmanager webhook: a real aiohttp server on a free port plays Alertmanager.

The health agent runs with real NATS and the API emulator (the `health` harness of this
folder's conftest); a FakeMonitor reports the faults.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from services.health.config import HealthConfig
from services.health.monitors.fake import FakeMonitor
from services.health.webhook import WebhookNotifier, postable_alert
from shared.errors import ConfigError
from shared.pb.drasuite.v1 import alert_pb2
from shared.vendors.parts.observation import Fault

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
XID = Fault(cause="xid", code="79", message="GPU has fallen off the bus")
LABELS = {
    "alertname": "DRADeviceUnhealthy",
    "driver": DRIVER,
    "node": NODE,
    "pool": NODE,
    "device": "gpu-0",
    "cause": "xid",
    "code": "79",
    "severity": "critical",
}


class Alertmanager:
    """Records every POST to /api/v2/alerts; answers 500 to the first `failures` of them."""

    def __init__(self) -> None:
        self.requests = 0
        self.failures = 0
        self.accepted: list[dict[str, Any]] = []
        self.url = ""

    async def post_alerts(self, request: web.Request) -> web.Response:
        self.requests += 1
        body = await request.json()
        if self.failures > 0:
            self.failures -= 1
            return web.json_response({"error": "try again"}, status=500)
        self.accepted.extend(body)
        return web.json_response({})


@pytest.fixture
async def alertmanager() -> AsyncIterator[Alertmanager]:
    receiver = Alertmanager()
    app = web.Application()
    app.router.add_post("/api/v2/alerts", receiver.post_alerts)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    receiver.url = f"http://127.0.0.1:{sock.getsockname()[1]}/api/v2/alerts"
    try:
        yield receiver
    finally:
        await runner.cleanup()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/api/v2/alerts"


def rfc3339(unix_ms: str) -> str:
    starts: str = postable_alert(alert_pb2.Alert(raised_unix_ms=int(unix_ms)))["startsAt"]
    return starts


async def test_a_fault_is_posted_once_with_its_labels_and_start(health, alertmanager):
    health.create_node()
    monitor = FakeMonitor(pool=NODE, devices=("gpu-0", "gpu-1"))
    config = health.config(alert_webhook_url=alertmanager.url)
    async with health.running(config, monitor=monitor) as agent:
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        monitor.report({"gpu-0": XID})
        (raised,) = await health.eventually(health.alerts_with("ALERT_STATUS_RAISED"))
        await health.eventually(health.now(lambda: alertmanager.accepted))
        await asyncio.sleep(0.3)  # room for a wrong second POST
        (posted,) = alertmanager.accepted
        assert posted["labels"] == LABELS
        assert posted["startsAt"] == rfc3339(raised["raisedUnixMs"])
        assert posted["startsAt"].endswith("Z")
        assert "endsAt" not in posted
        assert posted["annotations"]["taint"] == f"{DRIVER}/xid=79:NoSchedule"
        assert posted["annotations"]["description"] == XID.message
        assert posted["generatorURL"] == ""
        assert alertmanager.requests == 1
        assert agent.webhook is not None
        assert agent.webhook.delivered == 1


async def test_a_cleared_fault_is_posted_with_its_end(health, alertmanager):
    health.create_node()
    monitor = FakeMonitor(pool=NODE, devices=("gpu-0",))
    config = health.config(alert_webhook_url=alertmanager.url)
    async with health.running(config, monitor=monitor):
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        monitor.report({"gpu-0": XID})
        await health.eventually(health.state_is("gpu-0", health.UNHEALTHY))
        monitor.report({})
        (resolved,) = await health.eventually(health.alerts_with("ALERT_STATUS_RESOLVED"))
        await health.eventually(health.now(lambda: len(alertmanager.accepted) == 2))
        raised_post, resolved_post = alertmanager.accepted
        assert resolved_post["labels"] == raised_post["labels"] == LABELS
        assert resolved_post["startsAt"] == raised_post["startsAt"]
        assert resolved_post["endsAt"] == rfc3339(resolved["resolvedUnixMs"])
        assert resolved_post["endsAt"] >= resolved_post["startsAt"]


async def test_a_failing_receiver_gets_the_alert_once_after_retries(health, alertmanager):
    health.create_node()
    alertmanager.failures = 2
    monitor = FakeMonitor(pool=NODE, devices=("gpu-0",))
    config = health.config(alert_webhook_url=alertmanager.url)
    async with health.running(config, monitor=monitor) as agent:
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        monitor.report({"gpu-0": XID})
        await health.eventually(health.now(lambda: alertmanager.accepted))
        await asyncio.sleep(0.3)
        assert alertmanager.requests == 3
        assert [a["labels"] for a in alertmanager.accepted] == [LABELS]
        assert agent.webhook is not None
        assert (agent.webhook.delivered, agent.webhook.dropped) == (1, 0)


async def test_a_receiver_that_is_down_neither_stops_the_agent_nor_the_stream(health):
    health.create_node()
    monitor = FakeMonitor(pool=NODE, devices=("gpu-0",))
    config = health.config(alert_webhook_url=closed_port_url(), alert_webhook_attempts=2)
    async with health.running(config, monitor=monitor) as agent:
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        monitor.report({"gpu-0": XID})
        await health.eventually(health.alerts_with("ALERT_STATUS_RAISED"))
        webhook = agent.webhook
        assert webhook is not None
        await health.eventually(health.now(lambda: webhook.dropped == 1))
        monitor.report({})
        await health.eventually(health.alerts_with("ALERT_STATUS_RESOLVED"))
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        assert webhook.delivered == 0


async def test_still_raised_alerts_are_re_sent_so_alertmanager_keeps_them(health, alertmanager):
    health.create_node()
    monitor = FakeMonitor(pool=NODE, devices=("gpu-0",))
    config = health.config(alert_webhook_url=alertmanager.url, alert_webhook_resend_s=0.2)
    async with health.running(config, monitor=monitor):
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        monitor.report({"gpu-0": XID})
        await health.eventually(health.now(lambda: len(alertmanager.accepted) >= 3))
        assert {a["startsAt"] for a in alertmanager.accepted} == {
            alertmanager.accepted[0]["startsAt"]
        }
        monitor.report({})
        await health.eventually(health.now(lambda: "endsAt" in alertmanager.accepted[-1]))
        count = len(alertmanager.accepted)
        await asyncio.sleep(0.5)
        assert len(alertmanager.accepted) == count, "a resolved alert is not re-sent"


async def test_a_full_queue_drops_the_oldest_alert():
    notifier = WebhookNotifier("http://127.0.0.1:9/api/v2/alerts", queue_size=2)
    for device in ("gpu-0", "gpu-1", "gpu-2"):
        notifier.notify(alert_pb2.Alert(device=device, cause="xid", code="79"))
    assert (notifier.pending, notifier.dropped) == (2, 1)


@pytest.mark.parametrize(
    ("taint", "status", "severity", "ends"),
    [
        ("d/xid=79:NoSchedule", alert_pb2.ALERT_STATUS_RAISED, "critical", False),
        ("d/xid=79:NoExecute", alert_pb2.ALERT_STATUS_RESOLVED, "critical", True),
        ("d/npu-subhealth=8:None", alert_pb2.ALERT_STATUS_RAISED, "warning", False),
        ("", alert_pb2.ALERT_STATUS_RAISED, "warning", False),
    ],
    ids=["NoSchedule is critical", "resolved has endsAt", "None is a warning", "untainted"],
)
def test_the_payload_has_the_severity_of_the_taint_and_an_end_when_resolved(
    taint: str, status: alert_pb2.AlertStatus.ValueType, severity: str, ends: bool
):
    alert = alert_pb2.Alert(
        status=status, device="gpu-0", cause="xid", taint=taint, raised_unix_ms=1_700_000_000_123
    )
    body = postable_alert(alert)
    assert body["labels"]["severity"] == severity
    assert "code" not in body["labels"], "empty labels are left out"
    assert body["startsAt"] == "2023-11-14T22:13:20.123Z"
    assert ("endsAt" in body) is ends


@pytest.mark.parametrize(
    "url",
    ["ftp://alertmanager/api/v2/alerts", "alertmanager:9093", "http://[::1"],
    ids=["not http", "no scheme", "malformed"],
)
def test_a_webhook_url_that_is_not_http_is_a_config_error(url: str):
    with pytest.raises(ConfigError):
        HealthConfig(node_name=NODE, alert_webhook_url=url)
