"""InstanceLock: a flock shared by plugin instances, taken without blocking the event loop."""

from __future__ import annotations

import asyncio

from services.allocation.dra.serialize import InstanceLock


async def test_two_instances_on_one_lock_file_take_turns(tmp_path):
    first, second = (
        InstanceLock(tmp_path / "serialize.lock"),
        InstanceLock(tmp_path / "serialize.lock"),
    )
    order: list[str] = []

    async def hold(lock: InstanceLock, name: str) -> None:
        async with lock.hold():
            order.append(f"{name}+")
            await asyncio.sleep(0.05)
            order.append(f"{name}-")

    async with first.hold():
        blocked = asyncio.create_task(hold(second, "second"))
        ticks = 0
        while ticks < 5:  # the loop keeps running while the other instance waits
            await asyncio.sleep(0.01)
            ticks += 1
        assert order == []
    await blocked
    await asyncio.gather(hold(first, "a"), hold(second, "b"), hold(first, "c"))
    assert order[:2] == ["second+", "second-"]
    pairs = [order[i : i + 2] for i in range(2, len(order), 2)]
    assert all(p[0][:-1] == p[1][:-1] for p in pairs), order
    first.close()
    second.close()


async def test_a_cancelled_waiter_does_not_keep_the_lock(tmp_path):
    first, second = (
        InstanceLock(tmp_path / "serialize.lock"),
        InstanceLock(tmp_path / "serialize.lock"),
    )
    async with first.hold():
        waiter = asyncio.create_task(second.hold().__aenter__())
        await asyncio.sleep(0.05)
        waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert waiter.cancelled()
    async with asyncio.timeout(2), first.hold():
        pass
    async with asyncio.timeout(2), second.hold():
        pass


async def test_without_rolling_updates_the_lock_is_a_no_op(tmp_path):
    lock = InstanceLock(None)
    assert not lock.shared
    async with lock.hold(), lock.hold():
        pass
    assert list(tmp_path.iterdir()) == []
