"""``adaptive_hold``: exact sequences of hold and resume (rules 4 to 6) with an injected
clock, and invariants over random sequences (hypothesis); :class:`QueueDelay`.

One worker learns a KV capacity of 2,000 tokens from its first scrape (1,000 running tokens at
``kv_usage`` 0.5); ``knee_pressure`` 100 keeps ``adaptive_sticky``'s knee out of the way, so
only the ceiling and the holds decide.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.router import RouterConfig, RoutingCore
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation
from sessionroute.router.policies import create_policy
from sessionroute.router.policies._queue_delay import QueueDelay
from sessionroute.router.policies.adaptive_hold import AdaptiveHoldConfig, AdaptiveHoldPolicy, Hold
from sessionroute.router.state import Cluster
from sessionroute.types import EngineGauges, RouteRequest

A, B = "http://a:8000", "http://b:8000"
BASE: dict[str, Any] = {
    "capacity_min_kv": 0.5,  # scrapes below 0.5 take no capacity sample: the capacity stays
    "knee_pressure": 100.0,
    "hold_interval_s": 10.0,
    "hold_cut": 0.7,
    "resume_fraction": 1.0,
    "hold_check_s": 1.0,
    "wait_bound": False,  # rule 6 (a held turn's wait bounded by its engine's queue): below
}
THRASH = EngineGauges(running=1, waiting=8, kv_usage=0.3)
CALM = EngineGauges(running=1, waiting=0, kv_usage=0.3)


def _core(
    workers: tuple[str, ...] = (A,), **options: Any
) -> tuple[RoutingCore, AdaptiveHoldPolicy, ManualClock]:
    clock = ManualClock()
    policy = AdaptiveHoldPolicy(
        AdaptiveHoldConfig(**{**BASE, **options}), clock=clock, rng=random.Random(0)
    )
    return RoutingCore(policy, Cluster(list(workers)), RouterConfig()), policy, clock


def _req(sid: str, tokens: int) -> RouteRequest:
    return RouteRequest(session_id=sid, prompt_tokens=tokens, request_id=f"{sid}.{tokens}")


def _turn(core: RoutingCore, sid: str, tokens: int, *, done: bool = True) -> Reservation:
    res = core.place(_req(sid, tokens), lambda t: None)
    assert isinstance(res, Reservation), f"{sid} was held"
    if done:
        core.complete(res)
    return res


def _four_sessions(
    core: RoutingCore, clock: ManualClock
) -> None:  # s1 1,000, s2 200, s3 300, s4 400 on A; capacity 2,000
    first = _turn(core, "s1", 1000, done=False)
    core.cluster.set_gauges(A, EngineGauges(running=1, waiting=0, kv_usage=0.5))
    for t, (sid, tokens) in enumerate((("s2", 200), ("s3", 300), ("s4", 400)), start=1):
        clock.set(float(t))
        _turn(core, sid, tokens)
        if sid == "s2":
            core.complete(first)


def _thrash_at_10(core: RoutingCore, clock: ManualClock) -> None:
    """A scrape shows 8 waiting; s1's next turn reads it: ceiling 0.7 x 1,900 = 1,330, and
    the newest sessions are held until the working set is under it: s4, then s3."""
    clock.set(10.0)
    core.cluster.set_gauges(A, THRASH)
    _turn(core, "s1", 1000)


def _held_at_10(**options: Any) -> tuple[RoutingCore, AdaptiveHoldPolicy, ManualClock]:
    """s4 and s3 held at 10 s (:func:`_thrash_at_10`)."""
    core, p, clock = _core(**options)
    _four_sessions(core, clock)
    _thrash_at_10(core, clock)
    return core, p, clock


def test_thrash_sets_a_ceiling_and_holds_the_newest_sessions_until_under_it() -> None:
    core, p, clock = _core()
    _four_sessions(core, clock)
    assert p.context_tokens() == {A: 1900} and p.ceiling == {}
    _thrash_at_10(core, clock)
    assert p.ceiling[A] == pytest.approx(1330.0) and p.cuts == 1
    held = p.held()
    assert list(held) == ["s4", "s3"] and [h.seq for h in held.values()] == [0, 1]
    assert held["s4"].until == 10.0 + 300.0  # hold_max_s
    assert p.context_tokens() == {A: 1200}  # held sessions left the working set


def test_held_turns_wait_and_resume_in_hold_order_when_the_worker_drains() -> None:
    core, p, clock = _held_at_10()
    ready: list[Ticket] = []
    clock.set(11.0)
    s3 = core.place(_req("s3", 350), ready.append)
    s5 = core.place(_req("s5", 100), ready.append)  # new: the worker holds sessions
    assert isinstance(s3, Ticket) and isinstance(s5, Ticket)
    core.finish_session("s2")  # 1,000 left: s3 (300) would fit under 1,330, s4 (400) not
    assert ready == [] and list(p.held()) == ["s4", "s3"]  # in order: s3 waits behind s4
    clock.set(12.0)
    core.finish_session("s1")  # 0 left: s4 resumes (400), then s3 (700) and its turn goes
    assert ready == [s3, s5] and p.held() == {}
    assert p.released["resumed"] == 2 and p.released["bound"] == 0
    assert p.held_turns == 1 and p.held_turn_wait_s_total == pytest.approx(1.0)
    assert p.hold_s_total == pytest.approx(4.0)  # s4 and s3, 10 s -> 12 s each
    assert p.context_tokens() == {A: 400 + 350 + 100}


def test_a_held_turn_leaves_at_its_bound_on_the_drivers_recheck() -> None:
    core, p, clock = _held_at_10(hold_max_s=30.0, hold_total_max_s=40.0)
    assert core.admission_recheck_s == 1.0
    ready: list[Ticket] = []
    clock.set(11.0)
    ticket = core.place(_req("s3", 350), ready.append)
    assert isinstance(ticket, Ticket)
    clock.set(39.9)
    core.recheck()
    assert ready == [] and "s3" in p.held()
    clock.set(40.0)
    core.recheck()  # both holds reach their bound (10 + 30 s); s3's turn goes
    assert ready == [ticket] and p.released["bound"] == 2
    assert p.held_s("s3") == pytest.approx(30.0) and p.held_s("s4") == pytest.approx(30.0)
    # the working set is still over the ceiling: both are held again, each only for what is
    # left of hold_total_max_s (40 - 30 = 10 s)
    assert {s: h.until for s, h in p.held().items()} == {"s4": 50.0, "s3": 50.0}
    clock.set(50.0)
    assert isinstance(core.place(_req("s4", 450), lambda t: None), Reservation)
    assert p.held_s("s4") == pytest.approx(40.0) and "s4" not in p.held()
    for t in (70.0, 80.0, 90.0):  # s4's budget is spent: never held again
        clock.set(t)
        core.cluster.set_gauges(A, THRASH)
        core.place(_req("s2", 200), lambda t: None)
        assert "s4" not in p.held()


def test_no_session_is_held_past_its_age_bound() -> None:
    core, p, clock = _held_at_10(hold_age_max_s=25.0)  # s4 first placed at 3 s, s3 at 2 s
    held = p.held()
    assert held["s4"].until == pytest.approx(28.0) and held["s3"].until == pytest.approx(27.0)
    clock.set(30.0)
    assert core.place(_req("s4", 450), lambda t: None)  # admitted: past its bound
    assert isinstance(core.place(_req("s3", 350), lambda t: None), Reservation)


def test_largest_first_holds_the_session_that_frees_the_most() -> None:
    # s1 (1,000) alone brings 1,900 under 1,330
    _, p, _ = _held_at_10(hold_pick="largest")
    assert list(p.held()) == ["s1"] and p.context_tokens() == {A: 900}


def test_release_session_of_a_held_session_frees_it() -> None:
    core, p, _ = _held_at_10()
    assert core.finish_session("s4")
    assert "s4" not in p.held() and p.released["gone"] == 1
    assert p.context_tokens() == {A: 1200}  # it was not counted while held, and is gone
    assert p.counters()["held_sessions"] == 2 and p.counters()["held_now"] == 1


@pytest.mark.parametrize(("turns", "short"), [(1, True), (3, False)])
def test_while_sessions_are_short_nothing_is_held_and_new_sessions_are_not_kept_off(
    turns: int, short: bool
) -> None:
    """short_turns 3: two sessions that ended after one turn each make sessions short (mean
    1): the thrash at 10 s sets a ceiling but holds no session, and a new session is placed
    on the worker over its ceiling; after three turns each they are not short (mean 3)."""
    core, p, clock = _core(short_turns=3.0)
    for sid in ("o1", "o2"):
        for _ in range(turns):
            _turn(core, sid, 10)
        assert core.finish_session(sid)
    assert p.mean_turns == pytest.approx(turns)
    _four_sessions(core, clock)
    _thrash_at_10(core, clock)
    assert p.ceiling[A] == pytest.approx(1330.0)
    assert (list(p.held()) == []) is short
    clock.set(11.0)
    new = core.place(_req("s5", 100), lambda t: None)
    assert isinstance(new, Reservation) is short
    assert p.counters()["mean_turns"] == turns


def test_sessions_held_when_sessions_turn_short_resume() -> None:
    """s4 and s3 held at 10 s; s2 ends after one turn, so sessions are short (mean 1 < 3):
    both resume in order and s3's waiting turn is placed, though s4 (400) would not fit
    under the ceiling yet (1,000 + 400 > 1,330)."""
    core, p, clock = _held_at_10(short_turns=3.0)
    ready: list[Ticket] = []
    clock.set(11.0)
    s3 = core.place(_req("s3", 350), ready.append)
    assert isinstance(s3, Ticket) and list(p.held()) == ["s4", "s3"]
    core.finish_session("s2")
    assert p.mean_turns == 1 and ready == [s3] and p.held() == {}
    assert p.released["resumed"] == 2


def test_while_sessions_are_short_a_ceiling_does_not_close_the_thrash_gate() -> None:
    """Rule 3 is ``adaptive_sticky``'s while sessions are short: a worker past its knee (0.5
    x 2,000) that last thrashed more than ``thrash_gate_s`` (300 s) ago admits a new session,
    though the thrash at 10 s left it a ceiling (1,330; calm scrapes raise it 1 % a time)."""
    core, p, clock = _core(short_turns=3.0, knee_pressure=0.5)
    for sid in ("o1", "o2"):
        _turn(core, sid, 10)
        assert core.finish_session(sid)
    _four_sessions(core, clock)
    _thrash_at_10(core, clock)
    clock.set(400.0)
    core.cluster.set_gauges(A, CALM)
    new = core.place(_req("s5", 100), lambda t: None)
    assert A in p.ceiling and isinstance(new, Reservation)


def test_a_ceiling_is_never_cut_below_its_floor() -> None:
    """ceiling_floor 0.9: the cut at 10 s stops at 0.9 x 2,000 = 1,800 (not 0.7 x 1,900 =
    1,330), so holding s4 (400) alone brings the working set under it."""
    _, p, _ = _held_at_10(ceiling_floor=0.9)
    assert p.ceiling[A] == pytest.approx(1800.0) and list(p.held()) == ["s4"]


@pytest.mark.parametrize("place", ["load", "cache_aware_v2"])
def test_while_sessions_are_short_new_sessions_can_follow_a_shared_prefix(place: str) -> None:
    """Two sessions ended after one turn (short, mean 1 < 3). ``big`` (4 content blocks,
    3,000 tokens) lands on one worker; a new session sharing its first 4 blocks goes there
    with ``short_place = "cache_aware_v2"`` (the longest prefix match), and to the other,
    less loaded worker by rule 1 with ``"load"``."""
    core, p, _ = _core((A, B), short_turns=3.0, short_place=place)
    assert p.needs_content is (place == "cache_aware_v2")
    for sid in ("o1", "o2"):
        _turn(core, sid, 10)
        assert core.finish_session(sid)
    big = core.place(
        RouteRequest(session_id="big", prompt_tokens=3000, request_id="b", blocks=(1, 2, 3, 4)),
        lambda t: None,
    )
    assert isinstance(big, Reservation)
    new = core.place(
        RouteRequest(session_id="n", prompt_tokens=80, request_id="n", blocks=(1, 2, 3, 4, 5)),
        lambda t: None,
    )
    assert isinstance(new, Reservation)
    assert (new.worker == big.worker) is (place == "cache_aware_v2")
    # o2 (sessions short once o1 ended), big and n
    assert p.counters()["short_placed"] == (3 if place == "cache_aware_v2" else 0)


def test_calm_scrapes_raise_the_ceiling_and_lift_it() -> None:
    core, p, clock = _held_at_10(hold_raise=0.5, lift_pressure=1.0)
    core.finish_session("s3")
    core.finish_session("s4")  # nothing held
    clock.set(20.0)
    core.cluster.set_gauges(A, CALM)
    _turn(core, "s1", 1000)
    assert p.ceiling[A] == pytest.approx(1995.0)  # 1,330 x 1.5 < 1.0 x capacity 2,000
    clock.set(30.0)
    core.cluster.set_gauges(A, EngineGauges(running=1, waiting=0, kv_usage=0.31))
    _turn(core, "s1", 1000)
    assert p.ceiling == {}  # lifted


@pytest.mark.parametrize(("queue_kv", "cut"), [(0.0, True), (0.3, True), (0.31, False)])
def test_the_queue_watermark_counts_only_at_hold_queue_kv(queue_kv: float, cut: bool) -> None:
    """THRASH has 8 waiting at kv_usage 0.3 (under hold_kv)."""
    _, p, _ = _held_at_10(hold_queue_kv=queue_kv)
    assert (A in p.ceiling) is cut and bool(p.held()) is cut


def test_without_hold_it_is_adaptive_sticky() -> None:
    core, p, _ = _held_at_10(hold=False)
    assert p.held() == {} and p.ceiling == {} and core.admission_recheck_s is None


def test_without_hold_short_place_reads_no_content() -> None:
    """Rule 7 learns session lengths only while holding (``hold = false`` is
    ``adaptive_sticky``): a ``short_place = "cache_aware_v2"`` (as a serving objective sets)
    never places a session then, so the router must not parse every prompt for it."""
    core, p, _ = _core((A, B), hold=False, short_turns=3.0, short_place="cache_aware_v2")
    assert not p.needs_content and not core.requests.needs_content
    for sid in ("o1", "o2", "n"):
        _turn(core, sid, 10)
        core.finish_session(sid)
    assert p.counters()["short_placed"] == 0


@pytest.mark.parametrize(
    ("options", "word"),
    [
        ({"hold_pick": "oldest"}, "hold_pick"),
        ({"resume_kv": 0.96}, "resume_kv"),
        ({"hold_cut": 1.0}, "hold_cut"),
        ({"hold_max_s": 700.0}, "hold_max_s"),
        ({"hold_waiting": 1.5}, "hold_waiting"),
        ({"hold_check_s": 0.0}, "hold_check_s"),
        ({"hold": 1}, "hold"),
        ({"short_place": "content"}, "short_place"),
        ({"ceiling_floor": -0.1}, "ceiling_floor"),
        ({"ceiling_floor": 1.2}, "ceiling_floor"),
    ],
)
def test_bad_options_are_named(options: dict[str, Any], word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        create_policy("adaptive_hold", options, clock=ManualClock())


# -- invariants over random sequences ----------------------------------------------------------
class LoggedHold(AdaptiveHoldPolicy):
    """Logs every hold that ends: (worker, seq, how)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ended: list[tuple[str, int, str]] = []

    def _end(self, hold: Hold, how: str) -> None:
        self.ended.append((hold.worker, hold.seq, how))
        super()._end(hold, how)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["turn"] * 4 + ["done"] * 3 + ["finish", "calm"] + ["thrash", "wait"] * 2),
        st.integers(0, 7),  # session
        st.integers(100, 900),  # tokens, or fiftieths of a second
    ),
    min_size=10,
    max_size=80,
)


@settings(max_examples=100, deadline=None)
@given(OPS, st.sampled_from([0.0, 2.0]))
def test_hold_invariants(ops: list[tuple[str, int, int]], short_turns: float) -> None:
    """Whatever the sequence: no hold outlasts its bounds, a held turn never waits past its
    bound once the driver rechecks, holds resume in hold order per worker, a released
    session is held no more, and none is held while sessions are short (``short_turns``)."""
    clock = ManualClock()
    options = {
        **BASE,
        "hold_max_s": 20.0,
        "hold_total_max_s": 30.0,
        "hold_age_max_s": 120.0,
        "overflow_pressure": 100.0,  # no moves: sessions stay where the holds are
        "short_turns": short_turns,
    }
    p = LoggedHold(AdaptiveHoldConfig(**options), clock=clock, rng=random.Random(0))
    core = RoutingCore(p, Cluster([A, B]), RouterConfig())
    cfg = p.hcfg
    open_: dict[int, Reservation] = {}
    tickets: dict[int, Ticket] = {}
    born: dict[str, float] = {}
    for w in (A, B):  # capacities: 1,000 running tokens at 0.5 on each
        open_[100 + len(open_)] = _turn(core, f"seed-{w}", 1000, done=False)
        core.cluster.set_gauges(w, EngineGauges(running=1, waiting=0, kv_usage=0.5))
    _turn(core, "seed-c", 100)
    for i in range(8):  # every session starts with a turn of 300 tokens
        open_[i] = _turn(core, f"s{i}", 300, done=False)
        born[f"s{i}"] = 0.0
    for op, i, n in ops:
        sid = f"s{i}"
        holds, short = p.holds, p.mean_turns is not None and p.mean_turns < short_turns
        if op == "turn" and i not in open_ and i not in tickets:
            placed = core.place(_req(sid, n), lambda t: None)
            if isinstance(placed, Reservation):
                open_[i] = placed
                born.setdefault(sid, clock.now())
            else:
                tickets[i] = placed
        elif op == "done" and i in open_:
            core.complete(open_.pop(i))
        elif op == "finish":
            core.finish_session(sid)
            assert sid not in p.held()
            born.pop(sid, None)  # a later turn starts the session again
        elif op in ("thrash", "calm"):
            g = THRASH if op == "thrash" else CALM
            core.cluster.set_gauges((A, B)[i % 2], EngineGauges(g.running, g.waiting, g.kv_usage))
        elif op == "wait":
            clock.advance(n / 50.0)
            core.recheck()
        for j, t in list(tickets.items()):  # placed tickets become requests in flight
            if not t.waiting:
                del tickets[j]
                if t.reservation is not None:
                    open_[j] = t.reservation
                    born.setdefault(f"s{j}", clock.now())
        short_now = p.mean_turns is not None and p.mean_turns < short_turns
        assert not (short and short_now) or p.holds == holds
        now = clock.now()
        for s, h in p.held().items():
            assert h.until - h.since <= cfg.hold_max_s + 1e-9
            assert p.held_s(s) + (h.until - h.since) <= cfg.hold_total_max_s + 1e-9
            assert h.until <= born.get(s, h.since) + cfg.hold_age_max_s + 1e-9
            assert p.held_s(s) <= cfg.hold_total_max_s + 1e-9
        if op == "wait":
            for j in tickets:  # after a recheck no held turn waits past its bound
                waiting = p.held().get(f"s{j}")
                assert waiting is None or now < waiting.until
    for w in (A, B):
        resumed = [seq for worker, seq, how in p.ended if worker == w and how == "resumed"]
        assert resumed == sorted(resumed)


# -- rule 6: four sessions finish four requests between the first scrape (1 s) and the one
# showing thrash (10 s): 4 completions in 9 s, so with 8 waiting the queueing delay is 18 s


def test_a_held_turn_leaves_once_it_waited_the_engines_queueing_delay() -> None:
    core, p, clock = _held_at_10(wait_bound=True)
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
    core, p, clock = _held_at_10(wait_bound=True)
    clock.set(11.0)
    core.cluster.set_gauges(A, EngineGauges(running=1, waiting=0, kv_usage=0.3))
    assert isinstance(core.place(_req("s3", 350), lambda t: None), Reservation)
    assert p.released["waited"] == 1 and p.held_turns == 1 and p.held_turn_wait_s_total == 0.0
    # the working set is still over the ceiling: s3 is held again, for its next turn
    assert list(p.held()) == ["s4", "s3"] and p.held()["s3"].since == 11.0


def test_without_the_bound_the_held_turn_waits_for_its_hold() -> None:
    core, p, clock = _held_at_10(wait_bound=False)
    clock.set(11.0)
    ready: list[Ticket] = []
    core.place(_req("s3", 350), ready.append)
    clock.set(100.0)
    core.recheck()
    assert ready == [] and list(p.held()) == ["s4", "s3"] and p.released["waited"] == 0


@pytest.mark.parametrize("bound_new", [False, True])
def test_a_new_sessions_wait_is_bounded_only_with_wait_bound_new(bound_new: bool) -> None:
    core, p, clock = _held_at_10(wait_bound=True, wait_bound_new=bound_new)
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
