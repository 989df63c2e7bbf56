"""``adaptive_hold``'s rule 6: a held turn waits at the router no longer than its engine's
queueing delay (Little's law on the scraped queue and the completion rate), with an injected
clock; and :class:`QueueDelay` itself.

The setting of ``test_policies_adaptive_hold``: one worker learns a KV capacity of 2,000
tokens; four sessions finish four requests between its first scrape (1 s) and the scrape
showing thrash (10 s): 4 completions in 9 s, so with 8 waiting the queueing delay is 18 s.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.router import RouterConfig, RoutingCore
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation
from sessionroute.router.policies._queue_delay import QueueDelay
from sessionroute.router.policies.adaptive_hold import AdaptiveHoldConfig, AdaptiveHoldPolicy
from sessionroute.router.state import Cluster
from sessionroute.types import EngineGauges, RouteRequest

A, B = "http://a:8000", "http://b:8000"
BASE: dict[str, Any] = {
    "capacity_min_kv": 0.5,
    "knee_pressure": 100.0,
    "hold_interval_s": 10.0,
    "hold_cut": 0.7,
    "resume_fraction": 1.0,
    "hold_check_s": 1.0,
}


def _core(**options: Any) -> tuple[RoutingCore, AdaptiveHoldPolicy, ManualClock]:
    clock = ManualClock()
    policy = AdaptiveHoldPolicy(
        AdaptiveHoldConfig(**{**BASE, **options}), clock=clock, rng=random.Random(0)
    )
    return RoutingCore(policy, Cluster([A]), RouterConfig()), policy, clock


def _req(sid: str, tokens: int) -> RouteRequest:
    return RouteRequest(session_id=sid, prompt_tokens=tokens, request_id=f"{sid}.{tokens}")


def _turn(core: RoutingCore, sid: str, tokens: int, *, done: bool = True) -> Reservation:
    res = core.place(_req(sid, tokens), lambda t: None)
    assert isinstance(res, Reservation), f"{sid} was held"
    if done:
        core.complete(res)
    return res


def _held_at_10(core: RoutingCore, clock: ManualClock) -> None:
    """s1..s4 on A (1,900 tokens), then thrash at 10 s: s4 and s3 are held."""
    first = _turn(core, "s1", 1000, done=False)
    core.cluster.set_gauges(A, EngineGauges(running=1, waiting=0, kv_usage=0.5))
    for t, (sid, tokens) in enumerate((("s2", 200), ("s3", 300), ("s4", 400)), start=1):
        clock.set(float(t))
        _turn(core, sid, tokens)
        if sid == "s2":
            core.complete(first)
    clock.set(10.0)
    core.cluster.set_gauges(A, EngineGauges(running=1, waiting=8, kv_usage=0.3))
    _turn(core, "s1", 1000)


def test_a_held_turn_leaves_once_it_waited_the_engines_queueing_delay() -> None:
    core, p, clock = _core()
    _held_at_10(core, clock)
    assert list(p.held()) == ["s4", "s3"]
    assert p._delay.delay(A, core.cluster) == pytest.approx(18.0)  # 8 / (4 / 9 s)
    ready: list[Ticket] = []
    clock.set(11.0)
    ticket = core.place(_req("s3", 350), ready.append)
    assert isinstance(ticket, Ticket)
    clock.set(28.9)
    core.recheck()
    assert ready == [] and "s3" in p.held()
    clock.set(29.0)  # 18 s after its turn came: it goes
    core.recheck()
    assert ready == [ticket] and ticket.reservation is not None
    assert ticket.reservation.waited_s == pytest.approx(18.0)
    assert p.released["waited"] == 1 and p.counters()["released"]["waited"] == 1
    # s4's turn has not come: it stays held; s3 is over the ceiling again, held for its next
    assert list(p.held()) == ["s4", "s3"] and p.held()["s3"].since == 29.0


def test_with_nothing_waiting_in_the_engine_a_held_turn_is_not_delayed() -> None:
    core, p, clock = _core()
    _held_at_10(core, clock)
    clock.set(11.0)
    core.cluster.set_gauges(A, EngineGauges(running=1, waiting=0, kv_usage=0.3))
    assert isinstance(core.place(_req("s3", 350), lambda t: None), Reservation)
    assert p.released["waited"] == 1 and p.held_turns == 1 and p.held_turn_wait_s_total == 0.0
    # the working set is still over the ceiling: s3 is held again, for its next turn
    assert list(p.held()) == ["s4", "s3"] and p.held()["s3"].since == 11.0


def test_without_the_bound_the_held_turn_waits_for_its_hold() -> None:
    core, p, clock = _core(wait_bound=False)
    _held_at_10(core, clock)
    clock.set(11.0)
    ready: list[Ticket] = []
    core.place(_req("s3", 350), ready.append)
    clock.set(100.0)
    core.recheck()
    assert ready == [] and list(p.held()) == ["s4", "s3"] and p.released["waited"] == 0


@pytest.mark.parametrize("bound_new", [False, True])
def test_a_new_sessions_wait_is_bounded_only_with_wait_bound_new(bound_new: bool) -> None:
    core, p, clock = _core(wait_bound_new=bound_new)
    _held_at_10(core, clock)
    ready: list[Ticket] = []
    clock.set(11.0)
    ticket = core.place(_req("s5", 100), ready.append)  # new: A holds sessions
    assert isinstance(ticket, Ticket)
    clock.set(28.9)
    core.recheck()
    assert ready == []
    clock.set(29.0)  # the fleet (A alone) has an 18 s queue
    core.recheck()
    assert ready == ([ticket] if bound_new else [])
    assert p.counters()["new_at_wait_bound"] == (1 if bound_new else 0)


def test_queue_delay_is_waiting_over_the_decayed_completion_rate() -> None:
    cluster = Cluster([A, B])
    q = QueueDelay(window_s=60.0)
    assert q.rate(A) is None and q.delay(A, cluster) == 0.0  # no gauges: nothing waits
    q.observe(A, 0.0)  # starts the clock
    for _ in range(10):
        q.done(A)
    q.observe(A, 10.0)
    assert q.rate(A) == pytest.approx(1.0)
    cluster.set_gauges(A, EngineGauges(running=4, waiting=8, kv_usage=0.9))
    assert q.delay(A, cluster) == pytest.approx(8.0)
    q.observe(A, 20.0)  # 10 s without a completion
    keep = math.exp(-10 / 60)
    assert q.rate(A) == pytest.approx(10 * keep / (10 * keep + 10))
    cluster.set_gauges(B, EngineGauges(running=4, waiting=2, kv_usage=0.9))
    assert q.delay(B, cluster) == math.inf  # a queue and no rate yet
    # the fleet as one queue: 10 waiting over A's rate (B has none)
    assert q.fleet_delay([A, B], cluster) == pytest.approx(10 / q.rate(A))  # type: ignore[operator]
    q.forget(A)
    assert q.rate(A) is None
    with pytest.raises(ConfigError, match="wait_rate_window_s must be > 0"):
        QueueDelay(0.0)


@pytest.mark.parametrize(
    ("options", "word"),
    [
        ({"wait_bound": "yes"}, "wait_bound must be true or false"),
        ({"wait_bound_new": 1}, "wait_bound_new must be true or false"),
        ({"wait_queue_factor": -1.0}, "wait_queue_factor must be >= 0"),
        ({"wait_rate_window_s": 0.0}, "wait_rate_window_s must be > 0"),
        ({"wait_rate_window_s": math.inf}, "wait_rate_window_s must be a finite number"),
    ],
)
def test_bad_wait_options_are_named(options: dict[str, Any], word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        AdaptiveHoldConfig(**options)
