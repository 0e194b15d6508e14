"""The re-assert pace of `shared.bus.ownkeys`: a burst at once, then growing waits, and a bound
on the re-puts of any stretch of time."""

from __future__ import annotations

import random

from shared.backoff import Backoff
from shared.bus.ownkeys import ReassertPace


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pace(clock: Clock, *, burst: int = 3) -> ReassertPace:
    backoff = Backoff(initial_s=0.5, max_s=8.0, rng=random.Random(7))
    return ReassertPace(burst=burst, quiet_s=60.0, backoff=backoff, clock=clock)


def test_a_burst_goes_out_at_once_then_each_wait_grows_to_the_cap():
    clock = Clock()
    pace = _pace(clock)
    waits = [pace.after_reassert() for _ in range(9)]
    assert waits[:2] == [0.0, 0.0]
    assert all(0 < w <= 8.0 for w in waits[2:])
    assert waits[2] <= 0.5 < waits[4]
    assert waits[-1] >= 4.0  # at the cap: never less than half of it


def test_the_pace_starts_afresh_once_the_keys_are_left_alone():
    clock = Clock()
    pace = _pace(clock)
    for _ in range(5):
        clock.now += pace.after_reassert()
    clock.now += 59.0
    assert pace.after_reassert() > 0  # still the same attack
    clock.now += 200.0
    assert [pace.after_reassert() for _ in range(2)] == [0.0, 0.0]


def test_no_stretch_of_time_gets_more_re_puts_than_the_bound():
    for seed in range(20):
        clock = Clock()
        pace = _pace(clock)
        pace.backoff.rng = random.Random(seed)
        start = clock.now
        puts = 0
        while clock.now - start <= 30.0:
            puts += 1
            clock.now += pace.after_reassert() + 0.001
        assert puts <= pace.most_in(30.0), seed
    assert _pace(Clock()).most_in(0.0) == 3
