"""The one-call-per-event engine surface the simulator uses (``Replica.arrive``,
``Replica.wake``, ``Replica.gauges``) equals the plain calls it stands for."""

from __future__ import annotations

import gc
import random

import pytest

from sessionroute.replica import PROFILES, EngineRequest, Replica, ReplicaConfig, RequestResult
from sessionroute.replica.api import EngineRequestError

CONFIG = ReplicaConfig(PROFILES["toy-8b-h100-tp1"], block_size=16, kv_capacity_tokens=4096)


def _requests(seed: int, n: int) -> list[tuple[float, EngineRequest]]:
    """``n`` arrivals of a few conversations that share prefixes (so the cache hits)."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.choice([0.0, 0.001, 0.01, 0.05, 0.2])
        conv = rng.randrange(4)
        plen = rng.randint(1, 900)
        olen = rng.randint(1, 60)
        keys = [conv * 1000 + k for k in range((plen + olen) // 16)]
        out.append((t, EngineRequest(f"r{i}", plen, olen, keys, None)))
    return out


def _plain(reqs: list[tuple[float, EngineRequest]], fast: bool) -> list[object]:
    """A driver of advance / add_request / next_event_time calls."""
    rep = Replica(CONFIG, fast=fast)
    log: list[object] = []
    for now, req in reqs:
        log.append(rep.advance(now))
        rep.add_request(req, now)
        log.append(rep.next_event_time())
        log.append(rep.gauges())
    t = rep.next_event_time()
    while t is not None:
        log.append(rep.advance(t))
        t = rep.next_event_time()
        log.append(t)
    return log


def _one_call(reqs: list[tuple[float, EngineRequest]], fast: bool) -> list[object]:
    """The same with arrive and wake (no limit: wake runs on to the next finish)."""
    rep = Replica(CONFIG, fast=fast)
    log: list[object] = []
    for now, req in reqs:
        done, t = rep.arrive(
            req.request_id, req.prompt_len, req.output_len, req.block_keys, None, now
        )
        log += [done, t]
        log.append(rep.gauges())
    t = rep.next_event_time()
    while t is not None:
        done, t, moves = rep.wake(t, float("inf"))
        # the plain loop advanced `moves` times with nothing finished before this
        log += [[], None] * moves + [done, t]
    return log


def _compress(log: list[object]) -> list[object]:
    """Drop the empty advances and the next-time entries between them (wake skips them)."""
    out: list[object] = []
    for x in log:
        if isinstance(x, list) and x and isinstance(x[0], RequestResult):
            out.append(x)
    return out


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_arrive_and_wake_give_what_advance_add_and_next_event_give(seed: int, fast: bool) -> None:
    reqs = _requests(seed, 60)
    plain = _plain(reqs, fast)
    one = _one_call(reqs, fast)
    assert _compress(one) == _compress(plain)
    finished = [r for batch in _compress(one) if isinstance(batch, list) for r in batch]
    assert len(finished) == 60


def test_wake_stops_before_its_limit_and_counts_its_moves() -> None:
    a = Replica(CONFIG)
    b = Replica(CONFIG)
    for rep in (a, b):
        rep.add_request(EngineRequest("x", 800, 40, list(range(52)), None), 0.0)
    # plain: every event time up to the finish
    times = []
    finished: list[RequestResult] = []
    t = a.next_event_time()
    while t is not None and not finished:
        times.append(t)
        finished = a.advance(t)
        t = a.next_event_time()
    assert len(times) >= 3 and finished
    last = times[-1]
    done, nt, moves = b.wake(times[0], last)  # stops before `last` (not inclusive)
    assert (done, nt, moves) == ([], last, len(times) - 2)
    assert b.time == times[-2]
    done, nt, moves = b.wake(last, last, inclusive=True)
    assert (done, nt, moves) == (finished, None, 0)
    assert b.time == last


def test_arrive_refuses_a_bad_request_before_running_anything() -> None:
    rep = Replica(CONFIG)
    rep.add_request(EngineRequest("a", 100, 10, list(range(6)), None), 0.0)
    with pytest.raises(EngineRequestError, match="duplicate"):
        rep.arrive("a", 100, 10, list(range(6)), None, 5.0)
    with pytest.raises(EngineRequestError, match="prompt_len must be >= 1"):
        rep.arrive("b", 0, 10, [], None, 5.0)
    assert rep.time == float("-inf")  # nothing ran


def test_a_run_raises_gc_thresholds_while_it_runs_and_restores_them() -> None:
    from sessionroute.clock import ManualClock
    from sessionroute.sim import SimSpec, run_simulation
    from sessionroute.sim.runner import GC_THRESHOLDS

    seen: list[tuple[int, int, int]] = []
    spec = SimSpec.model_validate({"workload": {"kind": "toy"}, "sim": {"max_simulated_s": 25}})
    old = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        run_simulation(
            spec,
            "sticky_least_loaded",
            wall_clock=ManualClock(),
            progress=lambda _: seen.append(gc.get_threshold()),
        )
        assert gc.get_threshold() == (700, 10, 10)
        assert GC_THRESHOLDS in seen  # progress callbacks during the run see the raised ones
    finally:
        gc.set_threshold(*old)
