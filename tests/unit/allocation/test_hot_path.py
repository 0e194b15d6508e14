"""Background writes give way to kubelet calls in flight, for a bounded time."""

from __future__ import annotations

import asyncio

from services.allocation.dra.hot_path import KubeletCalls


async def test_quiet_returns_at_once_when_no_call_is_in_flight():
    calls = KubeletCalls(max_delay_s=10)
    await asyncio.wait_for(calls.quiet(), 0.5)


async def test_quiet_waits_for_the_last_call_in_flight_to_end():
    calls = KubeletCalls(max_delay_s=10)
    with calls.busy():
        with calls.busy():
            waiter = asyncio.create_task(calls.quiet())
            await asyncio.sleep(0.01)
            assert not waiter.done()
        await asyncio.sleep(0.01)
        assert not waiter.done()  # one call is still in flight
    await asyncio.wait_for(waiter, 0.5)
    assert calls.in_flight == 0


async def test_a_steady_stream_of_calls_delays_a_write_only_up_to_the_bound():
    calls = KubeletCalls(max_delay_s=0.05)
    with calls.busy():
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(calls.quiet(), 1)
        assert loop.time() - started >= 0.04


async def test_a_failed_call_is_no_longer_counted():
    calls = KubeletCalls(max_delay_s=10)
    try:
        with calls.busy():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert calls.in_flight == 0
    await asyncio.wait_for(calls.quiet(), 0.5)
