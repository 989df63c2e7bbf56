"""Chained block keys: shared content gives equal keys, distinct content distinct keys."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sessionroute.keys import ROOT_KEY, chain_key
from sessionroute.replica import chain_block_keys
from sessionroute.workloads.content import SHARED_NAMESPACE, BlockChain, expand_trace_blocks


def _tokens(segments: list[tuple[int, int]]) -> list[int]:
    """A token-id sequence with the same content identity: token = segment * 10**6 + offset."""
    return [seg * 1_000_000 + off for seg, n in segments for off in range(n)]


def _chain(segments: list[tuple[int, int]], bs: int) -> BlockChain:
    c = BlockChain(bs)
    for seg, n in segments:
        c.append(seg, n)
    return c


# segment ids that equal lengths and offsets too (0, block multiples), where untyped items failed
segment_ids = st.integers(0, 4) | st.sampled_from([8, 16, 32, 48, 64])
segment_lists = st.lists(st.tuples(segment_ids, st.integers(0, 70)), min_size=0, max_size=8)


def _appended_once(segments: list[tuple[int, int]]) -> bool:
    """No segment follows itself (zero-length appends aside): BlockChain's contract."""
    ids = [seg for seg, n in segments if n]
    return all(x != y for x, y in pairwise(ids))


@settings(max_examples=200, deadline=None)
@given(a=segment_lists, b=segment_lists, bs=st.sampled_from([1, 4, 16, 64]))
def test_keys_agree_exactly_where_token_content_agrees(
    a: list[tuple[int, int]], b: list[tuple[int, int]], bs: int
) -> None:
    assume(_appended_once(a) and _appended_once(b))
    ka, kb = _chain(a, bs).keys, _chain(b, bs).keys
    ref_a, ref_b = chain_block_keys(_tokens(a), bs), chain_block_keys(_tokens(b), bs)
    assert len(ka) == len(ref_a)
    assert len(kb) == len(ref_b)
    for i in range(min(len(ka), len(kb))):
        assert (ka[i] == kb[i]) == (ref_a[i] == ref_b[i])
    # and a key never stands at two positions, within a chain or across two
    assert len(set(ka)) == len(ka)
    at = {k: i for i, k in enumerate(ka)}
    assert all(at.get(k, j) == j for j, k in enumerate(kb))


@pytest.mark.parametrize(
    ("a", "b", "bs"),
    [
        # a run's keys are consecutive: anchoring what follows on one of them (xor with the
        # next segment id) made these share keys at different positions
        ([(1, 16), (2, 32)], [(1, 32), (18, 32)], 16),
        ([(1, 16), (2, 5), (9, 40)], [(1, 32), (18, 5), (9, 40)], 16),
        # a segment id equal to an offset: with the anchor after a run taken as (run, end) and
        # lengths absorbed as is, A's anchor after its second run and B's block across
        # segments absorbed the same integers
        ([(1, 32), (5, 32), (9, 48)], [(1, 37), (32, 11), (9, 48)], 16),
        # found against dd786e1 (a mix per block, lengths absorbed as is)
        ([(3, 5), (1, 7), (3, 1)], [(3, 5), (1, 1), (3, 3), (8, 1), (2, 2)], 4),
    ],
)
def test_keys_do_not_collide_across_positions(
    a: list[tuple[int, int]], b: list[tuple[int, int]], bs: int
) -> None:
    ka, kb = _chain(a, bs).keys, _chain(b, bs).keys
    ref_a, ref_b = chain_block_keys(_tokens(a), bs), chain_block_keys(_tokens(b), bs)
    shared = set(ka) & set(kb)
    expected = {ka[i] for i in range(min(len(ka), len(kb))) if ref_a[i] == ref_b[i]}
    assert shared == expected


def test_a_turn_extends_the_previous_turns_keys() -> None:
    c = BlockChain(16)
    c.append(1, 6500)  # system prompt
    c.append(2, 1000)  # task
    c.append(3, 250)  # output of turn 0
    turn0 = list(c.keys)
    c.append(4, 300)  # observation
    c.append(5, 400)  # output of turn 1
    assert c.keys[: len(turn0)] == turn0
    assert len(c.keys) == (6500 + 1000 + 250 + 300 + 400) // 16
    assert c.tokens == 8450


def test_copies_branch_a_shared_prefix() -> None:
    base = BlockChain(16)
    base.append(1, 100)
    a, b = base.copy(), base.copy()
    a.append(2, 50)
    b.append(3, 50)
    shared = 100 // 16
    assert a.keys[:shared] == b.keys[:shared] == base.keys
    assert a.keys[shared] != b.keys[shared]  # block 6 mixes the shared tail with new content
    assert len(set(a.keys[shared:]) & set(b.keys[shared:])) == 0


def test_expanded_trace_blocks_share_exactly_the_common_id_prefix() -> None:
    a = expand_trace_blocks([7, 8, 9], 512, 1500, 16, namespace=-3)
    b = expand_trace_blocks([7, 8, 10], 512, 1400, 16, namespace=-3)
    assert len(a) == 1500 // 16
    assert len(b) == 1400 // 16
    common = 1024 // 16
    assert a[:common] == b[:common]
    assert all(x != y for x, y in zip(a[common:], b[common:], strict=False))


def test_expanded_keys_at_a_coarser_block_follow_the_block_holding_the_last_token() -> None:
    a = expand_trace_blocks([1, 2, 3, 4], 64, 256, 128, namespace=5)
    b = expand_trace_blocks([1, 2, 3, 9], 64, 256, 128, namespace=5)
    other_ns = expand_trace_blocks([1, 2, 3, 4], 64, 256, 128, namespace=6)
    assert a[0] == b[0] and a[1] != b[1]
    assert set(a).isdisjoint(other_ns)


def test_a_shared_prefix_is_common_to_every_namespace() -> None:
    a = expand_trace_blocks([1, 2], 64, 128, 32, namespace=1, shared_prefix_tokens=64)
    b = expand_trace_blocks([5, 6], 64, 128, 32, namespace=2, shared_prefix_tokens=64)
    assert a[:2] == b[:2]
    assert a[2:] != b[2:]


def test_trace_ids_are_chained_again_so_equal_ids_after_different_prefixes_never_share() -> None:
    # ids [1, 7] and [2, 7]: block 1 carries the same trace id after different content, so
    # its keys must differ (the replica model relies on chained keys; vLLM chains hashes).
    a = expand_trace_blocks([1, 7], 64, 128, 64, namespace=0)
    b = expand_trace_blocks([2, 7], 64, 128, 64, namespace=0)
    assert len(a) == len(b) == 2
    assert a[0] != b[0]
    assert a[1] != b[1]
    c = expand_trace_blocks([1, 7], 64, 128, 64, namespace=0)
    assert c == a


def test_block_keys_are_the_documented_chain_keys() -> None:
    c = BlockChain(16)
    c.append(5, 40)  # two full blocks of segment 5, 8 tokens left over
    s5 = chain_key(ROOT_KEY, 5)  # the segment's key; its full blocks: the key plus each offset
    k0, k1 = s5, s5 + 16
    assert c.keys == [k0, k1]
    c.append(6, 10)  # the block across segments: what follows 5 (its key, ~length), then 6
    k2 = chain_key(s5, ~40, 6)  # lengths absorbed as ~x, segment ids as is
    assert c.keys == [k0, k1, k2]
    c.append(7, 20)  # 2 tokens of 6 left over (from offset 8), then 14 tokens of 7, 6 left
    k3 = chain_key(k2, ~10, 7)  # k2 is segment 6's key
    assert c.keys == [k0, k1, k2, k3]
    assert c.tokens == 70
    c.append(8, 10)  # fills the block: the segment ends with it
    k4 = chain_key(k3, ~20, 8)
    c.append(9, 32)  # a run that ends its segment: what follows is anchored on (key, ~length)
    s9 = chain_key(k4, ~10, 9)
    c.append(10, 16)
    assert c.keys == [k0, k1, k2, k3, k4, s9, s9 + 16, chain_key(s9, ~32, 10)]
    assert c.tokens == 128
    for bad in (-1, 2**63):
        with pytest.raises(ValueError, match=r"segment ids must be in \[0, 2\*\*63\)"):
            c.append(bad, 5)


def test_a_segment_appended_twice_in_a_row_is_refused() -> None:
    c = BlockChain(16)
    c.append(5, 10)
    c.append(6, 0)  # empty: not a piece
    with pytest.raises(ValueError, match="twice in a row"):
        c.append(5, 10)
    copy = c.copy()
    with pytest.raises(ValueError, match="twice in a row"):
        copy.append(5, 1)
    copy.append(6, 1)
    copy.append(5, 1)  # after another segment: its tokens from offset 0 again
    assert copy.tokens == 12


def test_expanded_trace_keys_are_the_documented_chain_keys() -> None:
    keys = expand_trace_blocks([11, 12], 64, 128, 32, namespace=3, shared_prefix_tokens=32)
    c0 = chain_key(3, 11)
    c1 = chain_key(c0, 12)
    assert keys == [
        chain_key(SHARED_NAMESPACE, 32),
        chain_key(c0, 64),
        chain_key(c1, 96),
        chain_key(c1, 128),
    ]
