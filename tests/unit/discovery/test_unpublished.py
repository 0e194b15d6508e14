"""`unpublished.Unpublished`: the devices left out of the slices, what is new among them, and
their marks in the inventory."""

from __future__ import annotations

import asyncio

from services.discovery import layout, unpublished
from services.discovery.layout import Rejection
from shared.pb.drasuite.v1 import inventory_pb2

LONG = Rejection("gpu-long", ("attribute 'chipName': string is longer than 64 bytes",))
DEVICES = {"gpu-0", "gpu-long", "gpu-0-mig-1g"}


def _inventory() -> inventory_pb2.Inventory:
    devices = [inventory_pb2.Device(name=name) for name in sorted(DEVICES)]
    return inventory_pb2.Inventory(driver="d", node="n", pool="n", devices=devices)


def test_only_newly_dropped_devices_are_returned():
    dropped = unpublished.Unpublished()
    (new,) = dropped.update([LONG], [], devices=DEVICES)
    assert (new.device, new.reason) == ("gpu-long", layout.INVALID)
    assert dropped.update([LONG], [], devices=DEVICES) == []  # a re-plan: nothing new
    assert dropped.version == 1
    (withheld,) = dropped.update([LONG], ["gpu-0-mig-1g"], devices=DEVICES)
    assert withheld.reason == unpublished.WITHHELD
    assert dropped.update([], [], devices=DEVICES) == []
    assert not dropped.current
    assert dropped.summary() is None


def test_a_rejected_counter_set_is_no_device():
    dropped = unpublished.Unpublished()
    assert dropped.update([Rejection("gpu-0-counter-set", ("x",))], [], devices=DEVICES) == []


def test_the_summary_names_a_few_and_counts_the_rest():
    dropped = unpublished.Unpublished()
    many = [Rejection(f"d{i}", ("bad",)) for i in range(5)]
    dropped.update(many, [], devices={f"d{i}" for i in range(5)})
    assert dropped.summary() == (
        "5 device(s) not published in ResourceSlices: d0 (invalid: bad), d1 (invalid: bad), "
        "d2 (invalid: bad) and 2 more"
    )


def test_marks_are_set_and_cleared_on_a_copy():
    dropped = unpublished.Unpublished()
    plain = _inventory()
    assert dropped.mark(plain) is plain  # nothing to mark: the same message
    dropped.update([LONG], [], devices=DEVICES)
    marked = dropped.mark(plain)
    assert {d.name: d.unpublished for d in marked.devices} == {
        "gpu-0": "",
        "gpu-0-mig-1g": "",
        "gpu-long": "invalid: attribute 'chipName': string is longer than 64 bytes",
    }
    assert not any(d.unpublished for d in plain.devices)
    dropped.update([], [], devices=DEVICES)
    assert not any(d.unpublished for d in dropped.mark(marked).devices)


async def test_readers_wait_for_the_next_version():
    dropped = unpublished.Unpublished()
    waiter = asyncio.create_task(dropped.next(after=0))
    await asyncio.sleep(0)
    assert not waiter.done()
    dropped.update([LONG], [], devices=DEVICES)
    assert await asyncio.wait_for(waiter, 1) == 1
