"""The event core: ordering by (time, priority, sequence), no going back, stop."""

from __future__ import annotations

import random

import pytest

from sessionroute.clock import Clock
from sessionroute.sim.events import (
    PRIO_ARRIVAL,
    PRIO_FAULT,
    PRIO_SAMPLE,
    PRIO_TIMER,
    PRIO_WAKE,
    EventQueue,
    VirtualClock,
)


def test_events_run_by_time_then_priority_then_insertion_order() -> None:
    q = EventQueue()
    seen: list[str] = []
    q.push(2.0, PRIO_WAKE, seen.append, "t2-wake")
    q.push(1.0, PRIO_ARRIVAL, seen.append, "t1-arrival-a")
    q.push(1.0, PRIO_FAULT, seen.append, "t1-fault")
    q.push(1.0, PRIO_ARRIVAL, seen.append, "t1-arrival-b")
    q.push(1.0, PRIO_WAKE, seen.append, "t1-wake")
    q.run_until(float("inf"))
    assert seen == ["t1-fault", "t1-wake", "t1-arrival-a", "t1-arrival-b", "t2-wake"]
    assert q.now() == 2.0
    assert q.events_run == 5


def test_the_clock_follows_the_events_and_is_a_clock() -> None:
    clock = VirtualClock()
    q = EventQueue(clock)
    times: list[float] = []
    q.push(0.5, PRIO_WAKE, lambda _: times.append(clock.now()))
    q.push(3.0, PRIO_WAKE, lambda _: times.append(clock.now()))
    q.run_until(1.0)
    assert times == [0.5]
    assert q.peek_time() == 3.0
    assert isinstance(clock, Clock)


def test_scheduling_in_the_past_is_refused() -> None:
    q = EventQueue()
    q.push(5.0, PRIO_WAKE, lambda _: None)
    q.run_until(10.0)
    with pytest.raises(ValueError, match="past"):
        q.push(4.0, PRIO_WAKE, lambda _: None)


def test_stop_ends_the_run_after_the_current_event() -> None:
    q = EventQueue()
    seen: list[int] = []

    def first(_: object) -> None:
        seen.append(1)
        q.stop()

    q.push(1.0, PRIO_WAKE, first)
    q.push(1.0, PRIO_WAKE, lambda _: seen.append(2))
    q.run_until(float("inf"))
    assert seen == [1]
    assert len(q) == 1


def test_the_run_ends_when_only_sampling_events_are_left() -> None:
    q = EventQueue()
    ticks: list[float] = []

    def sample(_: object) -> None:
        ticks.append(q.now())
        q.push(q.now() + 1.0, PRIO_SAMPLE, sample)

    q.push(0.5, PRIO_SAMPLE, sample)
    q.push(2.2, PRIO_TIMER, lambda _: None)
    q.run_until(float("inf"))
    assert ticks == [0.5, 1.5]
    assert q.now() == 2.2


def _run_mixed(late: bool, seed: int) -> list[tuple[float, int]]:
    """Events that schedule more events; with ``late`` some go through ``push_late``."""
    rng = random.Random(seed)
    q = EventQueue()
    seen: list[tuple[float, int]] = []
    plan = [
        (rng.choice([0.0, 1.0, 2.5]), rng.random() < 0.5, rng.choice([1, 2, 3])) for _ in range(400)
    ]
    it = iter(plan)

    def fire(label: int) -> None:
        seen.append((q.now(), label))
        for _ in range(2):
            step = next(it, None)
            if step is None:
                return
            dt, use_late, prio = step
            t = q.now() + dt + (100.0 if use_late else 0.0)
            if late and use_late:
                q.push_late(t, prio, fire, len(seen) * 10 + prio)
            else:
                q.push(t, prio, fire, len(seen) * 10 + prio)

    q.push(0.0, PRIO_TIMER, fire, 0)
    q.run_until(float("inf"))
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_push_late_keeps_the_order_of_a_single_heap(seed: int) -> None:
    assert _run_mixed(late=True, seed=seed) == _run_mixed(late=False, seed=seed)
    assert len(_run_mixed(late=True, seed=seed)) > 300


def test_push_late_events_count_as_work_and_in_len() -> None:
    q = EventQueue()
    seen: list[str] = []
    q.push_late(10.0, PRIO_TIMER, seen.append, "a")
    q.push_late(20.0, PRIO_TIMER, seen.append, "b")
    q.push_late(15.0, PRIO_TIMER, seen.append, "c")  # earlier than the lane's last: the heap
    q.push(12.0, PRIO_SAMPLE, seen.append, "sample")
    assert len(q) == 4
    with pytest.raises(ValueError, match="past"):
        q.push_late(-1.0, PRIO_TIMER, seen.append, "x")
    q.run_until(float("inf"))
    assert seen == ["a", "sample", "c", "b"]
    assert len(q) == 0
