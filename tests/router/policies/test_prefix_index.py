"""The peer policies' approximate prefix index: one radix tree whose nodes list workers."""

from __future__ import annotations

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


def test_record_counts_each_block_once_per_worker() -> None:
    idx = ApproxPrefixIndex(1 << 20)
    idx.record(A, (1, 2, 3))
    idx.record(A, (1, 2, 3, 4, 5))  # a later turn: two new blocks
    idx.record(B, (1, 2))  # splits the edge A's prompts share
    idx.record(A, (1, 2, 7))  # leaves inside it
    assert idx.size(A) == 6 and idx.size(B) == 2
    assert idx.match(A, (1, 2, 3, 4, 5, 6)) == 5 and idx.match(B, (1, 2, 3)) == 2
    assert idx.match_all([A, B], (1, 2, 7, 8)) == [3, 2]


def test_holding_is_one_lookup_in_the_callers_order() -> None:
    idx = ApproxPrefixIndex(1 << 20)
    idx.record(C, (1, 2, 3))
    idx.record(A, (1, 2, 3, 4))
    idx.record(B, (1, 2))
    assert idx.holding([A, B, C], (1, 2, 3, 4), 3) == [A, C]
    assert idx.holding([C, B, A], (1, 2, 3, 4), 2) == [C, B, A]
    assert idx.holding([A, B, C], (1, 2, 3, 4), 4) == [A]


def test_bound_drops_the_least_recently_sent_leaves_and_forget_drops_a_worker() -> None:
    idx = ApproxPrefixIndex(4)
    idx.record(A, (1, 2, 3))
    idx.record(B, (1, 2, 3))
    idx.record(A, (7, 8))  # over A's bound of 4: its oldest leaf (1, 2, 3) goes, for A only
    assert idx.size(A) == 2 and idx.match(A, (1, 2, 3)) == 0 and idx.match(A, (7, 8)) == 2
    assert idx.match(B, (1, 2, 3)) == 3
    idx.record(A, (7, 8, 9, 10))  # 4 blocks: within the bound
    idx.record(A, (1, 2))  # 6: the least recently sent leaf (7, 8)'s tail (9, 10) goes first
    assert idx.size(A) == 4 and idx.match_all([A, B], (7, 8, 9)) == [2, 0]
    assert idx.match(A, (1, 2, 3)) == 2
    idx.forget(A)
    assert idx.size(A) == 0 and idx.match_all([A, B], (1, 2, 3)) == [0, 3]
    idx.forget(B)
    assert idx.holding([A, B], (1, 2), 1) == []
