"""The peer policies' approximate prefix index: an inverted index of chained block keys."""

from __future__ import annotations

from sessionroute.router.kv import KvIndex
from sessionroute.router.policies._prefix import ApproxPrefixIndex

A, B, C = "http://a", "http://b", "http://c"


def test_match_counts_the_leading_blocks_each_worker_was_sent() -> None:
    idx = ApproxPrefixIndex(1 << 20)
    idx.record(A, (1, 2, 3, 4))
    idx.record(B, (1, 2, 9))
    assert idx.match(A, (1, 2, 3, 7)) == 3
    assert idx.match(B, (1, 2, 3, 7)) == 2
    assert idx.match(C, (1, 2, 3, 7)) == 0
    assert idx.match_all([A, B, C], (1, 2, 3, 4, 5)) == [4, 2, 0]
    assert idx.match_all([A, B], ()) == [0, 0]
    assert idx.match_all([A, B], (8, 1)) == [0, 0]


def test_record_stores_only_the_new_blocks() -> None:
    idx = ApproxPrefixIndex(1 << 20)
    idx.record(A, (1, 2, 3))
    idx.record(A, (1, 2, 3, 4, 5))  # a later turn: two new blocks
    assert idx.size(A) == 5 and idx.match(A, (1, 2, 3, 4, 5, 6)) == 5


def test_holding_is_one_lookup_in_the_callers_order() -> None:
    idx = ApproxPrefixIndex(1 << 20)
    idx.record(C, (1, 2, 3))
    idx.record(A, (1, 2, 3, 4))
    idx.record(B, (1, 2))
    assert idx.holding([A, B, C], (1, 2, 3, 4), 3) == [A, C]
    assert idx.holding([C, B, A], (1, 2, 3, 4), 2) == [C, B, A]
    assert idx.holding([A, B, C], (1, 2, 3, 4), 4) == [A]


def test_bound_drops_the_oldest_keys_and_forget_drops_a_worker() -> None:
    idx = ApproxPrefixIndex(3)
    idx.record(A, (1, 2, 3))
    idx.record(A, (7, 8))  # over the bound: keys 1 and 2 go
    assert idx.size(A) == 3 and idx.match(A, (1, 2, 3)) == 0 and idx.match(A, (7, 8)) == 2
    idx.forget(A)
    assert idx.size(A) == 0 and idx.match_all([A], (7, 8)) == [0]


def test_kv_index_holders() -> None:
    index = KvIndex()
    index.store(B, [5, 6])
    index.store(A, [5])
    assert index.holders(5, [A, B, C]) == [A, B]
    assert index.holders(6, [A, B, C]) == [B]
    assert index.holders(7, [A, B]) == []
