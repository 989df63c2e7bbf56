"""Hypothesis state machines: random interleavings of select / complete / release / add /
remove / health change / sweep through :class:`sessionroute.router.core.RoutingCore`, for every
built-in policy, checked against a small model after every step."""

from __future__ import annotations

import random
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from sessionroute.clock import ManualClock
from sessionroute.errors import NoWorkerAvailable
from sessionroute.router.core import Reservation, RoutingCore
from sessionroute.router.policies import create_policy, policy_names
from sessionroute.router.policies.consistent_hash_bounded_load import (
    ConsistentHashBoundedLoadPolicy,
)
from sessionroute.router.state import Cluster
from sessionroute.types import DecisionKind, RouteRequest

URL_POOL = [f"http://10.0.0.{i}:8000" for i in range(5)]
SESSIONS = [None, "s0", "s1", "s2", "s3", "s4", "s5", "s6"]
TTL = 100.0
OPTIONS: dict[str, dict[str, Any]] = {
    "sticky_least_loaded": {"session_ttl_s": TTL, "sweep_interval_s": 30.0},
    "consistent_hash_bounded_load": {"session_ttl_s": TTL, "sweep_interval_s": 30.0},
    "cache_aware": {"max_tree_size": 24, "balance_abs_threshold": 2},
    "adaptive_sticky": {"session_ttl_s": TTL, "sweep_interval_s": 30.0},
    "adaptive_hold": {"session_ttl_s": TTL, "sweep_interval_s": 30.0},
}
PINNING = (
    "sticky_least_loaded",
    "consistent_hash_bounded_load",
    "adaptive_sticky",
    "adaptive_hold",
)
contents = st.one_of(
    st.none(),
    st.text(alphabet="abc", max_size=8),
    st.lists(st.integers(0, 3), max_size=8),
)


class PolicyMachine(RuleBasedStateMachine):
    """Drives one policy; subclasses set ``policy_name``."""

    policy_name: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.core = RoutingCore(
            create_policy(
                self.policy_name,
                OPTIONS.get(self.policy_name),
                clock=self.clock,
                rng=random.Random(0),
            ),
            Cluster(),
        )
        self.outstanding: list[Reservation] = []
        self.completed: list[Reservation] = []
        self.orphaned: set[int] = set()  # ids of reservations whose worker was removed
        self.pins: dict[str, tuple[str, float]] = {}  # model: session -> (worker, last turn)
        self.ring_memory: dict[tuple[str, frozenset[str]], str] = {}

    @initialize(n=st.integers(1, 4))
    def start(self, n: int) -> None:
        for url in URL_POOL[:n]:
            self.core.add_worker(url)

    # -- rules ---------------------------------------------------------------------------------
    @rule(sid=st.sampled_from(SESSIONS), content=contents, tokens=st.integers(0, 50))
    def route(self, sid: str | None, content: str | list[int] | None, tokens: int) -> None:
        cluster = self.core.cluster
        healthy = cluster.healthy()
        blocks = [ord(c) for c in content] if isinstance(content, str) else content
        request = RouteRequest(session_id=sid, prompt_tokens=tokens, blocks=blocks)
        if not healthy:
            try:
                self.core.route(request)
            except NoWorkerAvailable:
                return
            raise AssertionError("route succeeded with no healthy worker")
        res = self.core.route(request)
        assert res.worker in healthy, "selected a worker that was not healthy"
        self.outstanding.append(res)
        if sid is not None:
            self._check_session(sid, res, healthy)

    @precondition(lambda self: self.pins)
    @rule(i=st.integers(0, 10_000), content=contents)
    def revisit(self, i: int, content: str | list[int] | None) -> None:
        """Another turn of a session the model knows (the interesting case for stickiness)."""
        sids = sorted(self.pins)
        self.route(sids[i % len(sids)], content, 10)

    @precondition(lambda self: self.outstanding)
    @rule(i=st.integers(0, 10_000))
    def complete(self, i: int) -> None:
        res = self.outstanding.pop(i % len(self.outstanding))
        assert self.core.complete(res) is True
        self.completed.append(res)

    @precondition(lambda self: self.completed)
    @rule(i=st.integers(0, 10_000))
    def complete_again(self, i: int) -> None:
        before = self._loads()
        assert self.core.complete(self.completed[i % len(self.completed)]) is False
        assert self._loads() == before

    @rule(sid=st.sampled_from(SESSIONS[1:]))
    def release(self, sid: str) -> None:
        known = self.core.policy.worker_of(sid) is not None
        assert self.core.finish_session(sid) is known
        assert self.core.finish_session(sid) is False
        self.pins.pop(sid, None)

    @precondition(lambda self: len(self.core.cluster) < len(URL_POOL))
    @rule(i=st.integers(0, 10_000))
    def add_worker(self, i: int) -> None:
        absent = [u for u in URL_POOL if u not in self.core.cluster]
        self.core.add_worker(absent[i % len(absent)])

    @precondition(lambda self: len(self.core.cluster) > 0)
    @rule(i=st.integers(0, 10_000))
    def remove_worker(self, i: int) -> None:
        workers = self.core.cluster.workers()
        url = workers[i % len(workers)]
        self.core.remove_worker(url)
        self.orphaned.update(id(r) for r in self.outstanding if r.worker == url)
        self.pins = {s: p for s, p in self.pins.items() if p[0] != url}

    @precondition(lambda self: len(self.core.cluster) > 0)
    @rule(i=st.integers(0, 10_000), healthy=st.booleans())
    def set_health(self, i: int, healthy: bool) -> None:
        workers = self.core.cluster.workers()
        self.core.set_health(workers[i % len(workers)], healthy)

    @precondition(lambda self: self.pins)
    @rule(i=st.integers(0, 10_000))
    def fail_pinned_worker(self, i: int) -> None:
        """Mark the worker of a pinned session unhealthy (its next turn must move)."""
        url = self.pins[sorted(self.pins)[i % len(self.pins)]][0]
        if url in self.core.cluster:
            self.core.set_health(url, False)

    @rule(dt=st.sampled_from([0.0, 1.0, 29.0, 60.0, 99.0, 150.0]))
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule()
    def sweep(self) -> None:
        self.core.sweep(self.clock.now())
        now = self.clock.now()
        for sid, (_, last) in self.pins.items():
            if now - last >= TTL:
                assert self.core.policy.worker_of(sid) is None, f"{sid} outlived its TTL"

    # -- invariants ----------------------------------------------------------------------------
    def _loads(self) -> dict[str, int]:
        return {w: self.core.cluster.in_flight(w) for w in self.core.cluster.workers()}

    @invariant()
    def loads_match_outstanding_reservations(self) -> None:
        loads = self._loads()
        assert all(v >= 0 for v in loads.values())
        expected = dict.fromkeys(loads, 0)
        for r in self.outstanding:
            if id(r) not in self.orphaned:
                expected[r.worker] += 1
        assert loads == expected

    @invariant()
    def session_counts_only_on_known_workers(self) -> None:
        counts = self.core.policy.session_counts()
        assert set(counts) <= set(self.core.cluster.workers())
        assert all(c > 0 for c in counts.values())

    # -- session model -------------------------------------------------------------------------
    def _check_session(self, sid: str, res: Reservation, healthy: tuple[str, ...]) -> None:
        name = self.policy_name
        now = self.clock.now()
        if name == "consistent_hash":
            key = (sid, frozenset(healthy))
            assert self.ring_memory.setdefault(key, res.worker) == res.worker
            return
        if name not in PINNING:
            return
        counts = dict(self.core.policy.session_counts())
        pin = self.pins.get(sid)
        live = pin is not None and now - pin[1] < TTL and pin[0] in healthy
        if name in ("adaptive_sticky", "adaptive_hold"):  # no gauges: no escape, no holds
            if live and pin is not None:
                assert (res.worker, res.kind) == (pin[0], DecisionKind.STICKY)
            else:
                assert res.kind is not DecisionKind.STICKY
        elif name == "sticky_least_loaded":
            if live and pin is not None:
                assert (res.worker, res.kind) == (pin[0], DecisionKind.STICKY)
            else:
                assert res.kind is not DecisionKind.STICKY
                before = {w: counts.get(w, 0) for w in healthy}
                before[res.worker] -= 1
                assert before[res.worker] == min(before.values()), "not the fewest sessions"
        else:
            self._check_bounded(res, pin if live else None, counts, len(healthy))
        self.pins[sid] = (res.worker, now)

    def _check_bounded(
        self,
        res: Reservation,
        pin: tuple[str, float] | None,
        counts: dict[str, int],
        n: int,
    ) -> None:
        policy = self.core.policy
        assert isinstance(policy, ConsistentHashBoundedLoadPolicy)
        total = sum(counts.values())
        bound = policy.bound(total, n)
        if pin is not None:
            moved = res.worker != pin[0]
            at_check = counts.get(pin[0], 0) + (1 if moved else 0)
            assert moved == (at_check > bound), (moved, at_check, bound)
            assert res.kind is (DecisionKind.REPINNED if moved else DecisionKind.STICKY)
            if not moved:
                return
        assert res.kind is not DecisionKind.STICKY
        assert counts[res.worker] <= bound, "placed above the bound"


_SETTINGS = settings(
    max_examples=50,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _machine(name: str) -> type[PolicyMachine]:
    class Machine(PolicyMachine):
        policy_name = name

    Machine.__name__ = Machine.__qualname__ = f"Machine_{name}"
    Machine.TestCase.settings = _SETTINGS
    return Machine


for _name in policy_names():
    globals()[f"TestStateful_{_name}"] = _machine(_name).TestCase


def test_every_builtin_policy_has_a_machine() -> None:
    names = {k.removeprefix("TestStateful_") for k in globals() if k.startswith("TestStateful_")}
    assert names == set(policy_names())
    assert len(names) == 16
