"""The soak: 50 claims/s of prepare/unprepare churn with periodic faults (a device fault over
NATS, a sim hot-plug, an API fault on claim reads, cut watches), with every agent a process;
see tests/reliability/soak.py for what runs and what counts as a failure.

The 60-second version runs in CI. The 10-minute one is opt-in: DRA_SUITE_SOAK=1 (marker
`soak`). Both assert: no unexpected prepare/unprepare failure and no failed kubelet call; each
agent's RSS grows by at most 5 MiB after the warm-up; at rest after the churn its open fds and
asyncio tasks are back to what they were at rest before it (no slack: the soak waits for kept-
alive connections to close first). The 10-minute soak also checks that each agent's task floor
under load does not climb between the window after the warm-up and the last window; a 12 s
window is too short for a quiet floor on a loaded machine.
"""

from __future__ import annotations

import os

import pytest

from tests.reliability.harness import ReliabilityNode
from tests.reliability.soak import CI_PLAN, LONG_PLAN, SoakPlan, run_soak

pytestmark = pytest.mark.reliability

SOAK_ENV = "DRA_SUITE_SOAK"
RSS_GROWTH_LIMIT_MB = 5.0

long_soak = pytest.mark.skipif(
    os.environ.get(SOAK_ENV) != "1", reason=f"the 10-minute soak runs with {SOAK_ENV}=1"
)


@pytest.mark.parametrize(
    "plan",
    [
        pytest.param(CI_PLAN, id="60s", marks=pytest.mark.timeout(240)),
        pytest.param(
            LONG_PLAN, id="10min", marks=[pytest.mark.soak, long_soak, pytest.mark.timeout(900)]
        ),
    ],
)
async def test_churn_with_faults_leaks_nothing(node: ReliabilityNode, plan: SoakPlan):
    report = await run_soak(node, plan)
    print(report.summary())

    assert report.unexpected_failures == []
    assert report.kubelet_retries == 0
    assert report.claims_cycled == report.claims_started > 0
    assert set(report.faults) == {"device_fault", "hot_plug", "api_fault", "watch_cut"}
    assert report.health_messages > 0
    for agent in report.agents.values():
        assert len(agent.pids) == 1, f"{agent.agent} restarted: {sorted(agent.pids)}"
        assert agent.rss_growth_mb <= RSS_GROWTH_LIMIT_MB, agent.summary()
        assert agent.fd_delta <= plan.fd_slack, agent.summary()
        assert agent.task_delta <= plan.task_slack, agent.summary()
        if plan.task_growth_slack is not None:
            assert agent.task_growth <= plan.task_growth_slack, agent.summary()
