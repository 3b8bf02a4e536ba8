"""The one back-off helper: its schedule, its jitter (from an injected source), its deadlines."""

from __future__ import annotations

import random

import pytest

from foldline.backoff import OUTAGE, Backoff


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pauses_grow_by_the_factor_up_to_the_cap() -> None:
    assert [OUTAGE.pause(n) for n in range(1, 9)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    three = Backoff(initial_s=1.0, cap_s=50.0, factor=3.0)
    assert [three.pause(n) for n in range(1, 6)] == [1.0, 3.0, 9.0, 27.0, 50.0]
    assert three.pause(0) == 1.0  # no failure yet counts as the first


def test_a_long_outage_never_overflows_the_schedule() -> None:
    assert OUTAGE.pause(10**9) == 2.0
    assert Backoff(initial_s=1e-6, cap_s=1e6, factor=10.0).pause(10**6) == 1e6
    assert Backoff(initial_s=0.0, cap_s=1.0).pause(50) == 0.0
    assert Backoff(initial_s=0.5, cap_s=0.5, factor=1.0).pause(10**6) == 0.5


def test_jitter_cuts_each_pause_by_up_to_its_fraction_drawn_from_the_given_source() -> None:
    jittered = Backoff(initial_s=1.0, cap_s=8.0, jitter=0.25)
    draws = random.Random(7)
    expected = [min(8.0, 2.0 ** (n - 1)) * (1 - 0.25 * draws.random()) for n in range(1, 40)]
    rng = random.Random(7)
    got = [jittered.pause(n, rng) for n in range(1, 40)]
    assert got == expected  # deterministic for a given source
    assert all(0.75 * min(8.0, 2.0 ** (n - 1)) <= p <= min(8.0, 2.0 ** (n - 1)) for n, p in enumerate(got, 1))
    full = Backoff(initial_s=0.1, cap_s=2.0, jitter=1.0)
    assert all(0.0 <= full.pause(3) <= 0.4 for _ in range(200))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"initial_s": -1.0, "cap_s": 1.0}, "0 <= initial_s <= cap_s"),
        ({"initial_s": 2.0, "cap_s": 1.0}, "0 <= initial_s <= cap_s"),
        ({"initial_s": 0.1, "cap_s": 1.0, "factor": 0.5}, "factor must be at least 1"),
        ({"initial_s": 0.1, "cap_s": 1.0, "jitter": 1.5}, "jitter must be within"),
    ],
)
def test_limits_that_make_no_schedule_are_refused(kwargs: dict[str, float], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Backoff(**kwargs)


def test_pauses_without_a_deadline_start_over_after_a_success() -> None:
    pauses = OUTAGE.pauses()
    assert [pauses.next() for _ in range(3)] == [0.05, 0.1, 0.2]
    assert (pauses.failures, pauses.last) == (3, 0.2)
    pauses.reset()
    assert pauses.next() == 0.05


def test_an_outage_is_given_up_when_the_next_attempt_would_begin_past_the_deadline() -> None:
    clock = FakeClock()
    waits = Backoff(initial_s=1.0, cap_s=4.0).until(6.0, clock=clock)
    seen = []
    while (pause := waits.next()) is not None:
        seen.append(pause)
        clock.now += pause
    # 1 s, then 2 s (at 3 s), then 4 s would end at 7 s, past the 6 s deadline
    assert seen == [1.0, 2.0]
    assert waits.remaining() == 3.0
    assert waits.failures == 3


def test_a_clipped_wait_looks_a_last_time_at_the_deadline_and_not_after() -> None:
    clock = FakeClock()
    waits = Backoff(initial_s=1.0, cap_s=4.0).until(6.0, clip=True, clock=clock)
    seen = []
    while (pause := waits.next()) is not None:
        seen.append(pause)
        clock.now += pause
    assert seen == [1.0, 2.0, 3.0]  # the third pause cut to end at the deadline
    assert waits.remaining() == 0.0


def test_a_reset_keeps_the_deadline() -> None:
    clock = FakeClock()
    waits = OUTAGE.until(1.0, clock=clock)
    assert waits.next() == 0.05
    clock.now += 0.9
    waits.reset()
    assert waits.next() == 0.05
    clock.now += 0.06
    assert waits.next() is None  # 0.1 s more would pass the deadline
