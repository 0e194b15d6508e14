"""Upgrading the health agent on an Ascend node whose chips it used to name differently.

Before the Ascend device model was shared, the monitor named a 310P chip `npu-<card>`
(`npu-7` on the captured 310P3) and an A3 die `npu-<card>-<die>`, while discovery published
`npu-0`: its faults tainted devices that do not exist (or the wrong chip). After the upgrade
the monitor reports `npu-0`; what the earlier run left under the old name must go: the
DeviceTaintRule, the health record, and the open alert (a RESOLVED one saying it was
withdrawn). The `health` harness comes from this folder's conftest.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from services.health.monitors.fake import FakeMonitor
from shared.vendors.ascend.monitor import AscendMonitor
from shared.vendors.parts.observation import Fault
from tests.fakes.npusmi import FIXTURES

pytestmark = pytest.mark.integration

OLD_NAME = "npu-7"
"""The old monitor's name of the 310P3 of the capture (card 7, Device 0)."""
NEW_NAME = "npu-0"
"""Discovery's name of it, the monitor's now."""
HEARTBEAT = Fault(cause="npu", code="80E18402", message="heartbeat lost")


async def _npu_smi(argv: Sequence[str], timeout_s: float) -> str:
    assert list(argv[1:]) == ["info"], argv  # a healthy chip: no health query
    return (FIXTURES / "310p3-published.txt").read_text()


async def test_rules_records_and_alerts_under_the_old_names_are_withdrawn(health):
    health.create_node()
    before = FakeMonitor(pool=health.NODE, devices=(OLD_NAME,))
    before.faults = {OLD_NAME: HEARTBEAT}
    async with health.running(monitor=before):  # the earlier run, with the old name
        await health.eventually(health.state_is(OLD_NAME, health.UNHEALTHY))
        await health.eventually(health.now(lambda: health.rules_for(OLD_NAME)))
        (raised,) = await health.eventually(health.alerts_with("ALERT_STATUS_RAISED"))
    assert raised["device"] == OLD_NAME

    upgraded = AscendMonitor(pool=health.NODE, runner=_npu_smi, poll_s=0.05)
    async with health.running(monitor=upgraded):
        await health.eventually(health.state_is(NEW_NAME, health.HEALTHY))
        await health.eventually(health.now(lambda: not health.rules_for(OLD_NAME)))

        async def old_record_gone() -> bool:
            return await health.record(OLD_NAME) is None

        await health.eventually(old_record_gone)
        (resolved,) = await health.eventually(health.alerts_with("ALERT_STATUS_RESOLVED"))
        assert resolved["device"] == OLD_NAME
        assert resolved["raisedUnixMs"] == raised["raisedUnixMs"]  # closes that alert
        assert "withdrawn: the device is no longer reported" in resolved["message"]
        assert not health.rules_for(NEW_NAME)
    assert [a["status"] for a in await health.stream_alerts()] == [
        "ALERT_STATUS_RAISED",
        "ALERT_STATUS_RESOLVED",
    ]
