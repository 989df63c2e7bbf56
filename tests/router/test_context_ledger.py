"""``ContextLedger``: the per-worker sums always equal a recount of the live entries, whatever
the sequence of turns, moves, removals, idle passes (whole or in chunks) and forgets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionroute.router.policies._context_ledger import ContextLedger

WORKERS = ("a", "b", "c")
SIDS = tuple(f"s{i}" for i in range(8))

ops = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.sampled_from(SIDS), st.sampled_from(WORKERS),
                  st.integers(0, 50)),
        st.tuples(st.just("move"), st.sampled_from(SIDS), st.sampled_from(WORKERS)),
        st.tuples(st.just("forget"), st.sampled_from(SIDS)),
        st.tuples(st.just("remove"), st.sampled_from(WORKERS)),
        st.tuples(st.just("idle"), st.integers(0, 5), st.one_of(st.none(), st.integers(0, 3))),
        st.tuples(st.just("tick"), st.integers(1, 3)),
    ),
    max_size=60,
)  # fmt: skip


def _recount(ledger: ContextLedger, shadow: dict[str, tuple[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for sid, (worker, tokens) in shadow.items():
        entry = ledger.get(sid)
        assert entry is not None and (entry.worker, entry.tokens) == (worker, tokens)
        if tokens:
            out[worker] = out.get(worker, 0) + tokens
    return out


@settings(max_examples=300, deadline=None)
@given(ops)
def test_sums_match_a_recount_of_the_live_entries(seq: list[tuple]) -> None:  # type: ignore[type-arg]
    ledger = ContextLedger()
    shadow: dict[str, tuple[str, int]] = {}  # live sessions: worker, tokens counted
    last: dict[str, int] = {}
    now = 0
    for op in seq:
        if op[0] == "turn":
            _, sid, worker, tokens = op
            entry = ledger.get(sid)
            if entry is not None and entry.worker == worker:
                ledger.turn(sid, entry, tokens, now)
            else:
                ledger.track(sid, worker, tokens, now)
            shadow[sid] = (worker, tokens)
            last[sid] = now
        elif op[0] == "move":
            _, sid, target = op
            entry = ledger.get(sid)
            if entry is not None:
                ledger.move(entry, target, now)
                assert entry.moved_at == now
                shadow[sid] = (target, shadow[sid][1])
        elif op[0] == "forget":
            forgotten = ledger.forget(op[1])
            assert (forgotten is not None) == (op[1] in shadow)
            shadow.pop(op[1], None)
        elif op[0] == "remove":
            ledger.remove_worker(op[1])
            shadow = {s: v for s, v in shadow.items() if v[0] != op[1]}
        elif op[0] == "idle":
            # a limited pass visits at most `limit` entries (stale and zero-token ones too), so
            # which sessions it stops counting is checked by its properties, not predicted
            _, back, limit = op
            before = now - back
            more = ledger.idle_pass(before, limit)
            counted = [s for s, v in shadow.items() if v[1]]
            zeroed = [s for s in counted if (e := ledger.get(s)) is not None and e.tokens == 0]
            assert all(last[s] <= before for s in zeroed)  # only idle sessions stop counting
            assert limit is None or len(zeroed) <= limit
            for s in zeroed:
                shadow[s] = (shadow[s][0], 0)
            left = [s for s, v in shadow.items() if v[1] and last[s] <= before]
            if limit is None or not more:
                assert left == []  # a pass that says it is done left no idle session counted
            assert all(last[t] >= last[s] for s in zeroed for t in left)  # oldest first
        else:
            now += op[1]
        recount = _recount(ledger, shadow)
        assert ledger.context == recount
        assert ledger.total == sum(recount.values())
    for sid in SIDS:  # stale or forgotten sessions are nowhere
        if sid not in shadow:
            assert ledger.get(sid) is None


def test_a_removed_workers_entries_go_stale_and_a_new_turn_replaces_them() -> None:
    ledger = ContextLedger()
    e = ledger.track("s", "a", 100, 0.0)
    ledger.move(e, "b", 1.0)
    ledger.remove_worker("b")
    assert ledger.context == {} and ledger.total == 0 and ledger.get("s") is None
    assert len(ledger) == 1  # left in place (O(1) removal), dropped on the next turn
    fresh = ledger.track("s", "a", 120, 2.0)
    assert fresh.moved_at < 0  # a stale entry's move does not carry over
    assert ledger.context == {"a": 120} and len(ledger) == 1


def test_the_idle_pass_visits_only_sessions_that_went_idle_oldest_first() -> None:
    ledger = ContextLedger()
    for i in range(5):
        ledger.track(f"s{i}", "a", 10, float(i))
    assert ledger.idle_pass(2.0, limit=2)  # s0, s1 stop counting; s2 is left for next time
    assert ledger.context == {"a": 30}
    assert not ledger.idle_pass(2.0, limit=2)  # s2; s3 is not idle
    assert ledger.context == {"a": 20}
    e = ledger.get("s0")
    assert e is not None
    ledger.turn("s0", e, 15, 9.0)  # counted again, now the newest
    assert ledger.context == {"a": 35}
    assert not ledger.idle_pass(4.0)
    assert ledger.context == {"a": 15}
