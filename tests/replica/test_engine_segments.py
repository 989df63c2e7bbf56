"""The run-length SegmentPool equals the per-block BlockPool on random operation sequences.

After every operation both pools must agree on the lookup result (hit blocks, idle hit blocks),
free blocks, usage, the cached keys of every salt and the LRU free queue itself (in eviction
order, each block shown as its cached key or None), so evictions happen in the same order.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionroute.replica.blocks import BlockPool, Holder, KVPool
from sessionroute.replica.segments import SegmentPool

from .pool_views import block_queue, segment_queue


def holder(keys: list[int], cache: dict[int, int]) -> Holder:
    """A request as a pool sees it (all its keys usable)."""
    return Holder(keys, len(keys), cache)


def chain(tokens: list[int]) -> list[int]:
    """Chained keys, one block per token (a tiny alphabet makes shared prefixes common)."""
    keys: list[int] = []
    parent = 7
    for t in tokens:
        parent = hash((parent, t))
        keys.append(parent)
    return keys


_OPS = (
    *("admit", "grow", "grow_each", "fill", "fill", "reset"),
    *("next_turn", "next_turn", "next_turn", "register", "register", "release", "release"),
    "release",
)
ops = st.lists(
    st.tuples(
        st.sampled_from(_OPS),
        st.integers(0, 10**6),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_blocks=st.integers(1, 40),
    alphabet=st.integers(1, 3),
    script=ops,
    data=st.data(),
)
def test_segment_pool_equals_block_pool(
    num_blocks: int, alphabet: int, script: list[tuple[str, int]], data: st.DataObject
) -> None:
    ref = BlockPool(num_blocks)
    seg = SegmentPool(num_blocks)
    pools: tuple[KVPool, KVPool] = (ref, seg)
    live: list[tuple[Holder, Holder]] = []
    contents: list[list[int]] = []  # token lists of admitted requests (for next turns)
    for op, x in script:
        if op in ("admit", "next_turn"):
            tokens = list(contents[x % len(contents)]) if op == "next_turn" and contents else []
            tokens += data.draw(st.lists(st.integers(0, alphabet - 1), max_size=8))
            salt = data.draw(st.sampled_from([None, None, None, "s"]))
            keys = chain(tokens)
            limit = data.draw(st.one_of(st.just(len(keys)), st.integers(0, len(keys))))
            hs = [holder(keys, p.cache_for(salt)) for p in pools]
            found = [p.lookup(h.cache, keys, limit) for p, h in zip(pools, hs, strict=True)]
            assert found[0][:2] == found[1][:2]
            hit, idle, _ = found[0]
            new = data.draw(st.integers(0, 4))
            if hit + new == 0 or new + idle > ref.num_free:
                continue
            full = data.draw(st.integers(hit, max(hit, min(hit + new, len(keys)))))
            for p, h, f in zip(pools, hs, found, strict=True):
                p.admit(h, f[2], new)
                h.nreg = hit
                if full > hit:
                    p.register(h, full)
                    h.nreg = full
            live.append((hs[0], hs[1]))
            contents.append(tokens)
        elif not live:
            if op == "reset":
                assert ref.reset_prefix_cache() == seg.reset_prefix_cache()
            continue
        elif op == "grow":
            pair = live[x % len(live)]
            n = 1 + x % 3
            if n > ref.num_free:
                continue
            for p, h in zip(pools, pair, strict=True):
                p.grow(h, n)
        elif op == "grow_each":
            group = [live[(x + i) % len(live)] for i in range(1 + x % 3)]
            if len(group) > ref.num_free:
                continue
            for i, p in enumerate(pools):
                p.grow_each([pair[i] for pair in group])
        elif op == "register":
            pair = live[x % len(live)]
            top = min(pair[0].nblocks, pair[0].nkeys)
            if top <= pair[0].nreg:
                continue
            full = pair[0].nreg + 1 + x % (top - pair[0].nreg)
            for p, h in zip(pools, pair, strict=True):
                p.register(h, full)
                h.nreg = full
        elif op == "fill":
            group = [live[(x + i) % len(live)] for i in range(1 + x % 3)]
            group = [pair for pair in dict.fromkeys(group) if pair[0].nreg < pair[0].nblocks]
            for h in (pair[0] for pair in group):
                if h.nreg < h.nkeys:
                    ref.register(h, h.nreg + 1)
                    h.nreg += 1
            seg.fill_each([pair[1] for pair in group])
        elif op == "release":
            pair = live.pop(x % len(live))
            for p, h in zip(pools, pair, strict=True):
                p.release(h)
        else:
            assert ref.reset_prefix_cache() == seg.reset_prefix_cache()
        assert (ref.num_free, ref.usage) == (seg.num_free, seg.usage)
        for salt in (None, "s"):
            assert ref.cached_keys(salt) == seg.cached_keys(salt)
        seg.audit()
        assert block_queue(ref) == segment_queue(seg)
        assert [(h.nblocks, h.nreg) for h, _ in live] == [(h.nblocks, h.nreg) for _, h in live]
    for pair in reversed(live):
        for p, h in zip(pools, pair, strict=True):
            p.release(h)
    assert ref.num_free == seg.num_free == num_blocks
    assert block_queue(ref) == segment_queue(seg)


def test_hit_on_part_of_an_idle_segment_splits_it_and_keeps_queue_order() -> None:
    # One request of 6 blocks finishes; another hits its first 2 blocks; the 4 deeper blocks
    # stay queued deepest first and are evicted before anything freed later.
    ref, seg = BlockPool(8), SegmentPool(8)
    keys = chain([1, 2, 3, 4, 5, 6])
    pools: tuple[KVPool, KVPool] = (ref, seg)
    for p in pools:
        a = holder(keys, p.cache_for(None))
        p.admit(a, [], 6)
        p.register(a, 6)
        a.nreg = 6
        p.release(a)
        b = holder(chain([1, 2, 9]), p.cache_for(None))
        h, idle, tok = p.lookup(b.cache, b.keys, 3)
        assert (h, idle) == (2, 2)
        p.admit(b, tok, 1)
        assert p.num_free == 8 - 3
    assert block_queue(ref) == segment_queue(seg) == [None, *keys[5:1:-1]]


def test_hit_in_the_middle_of_an_idle_segment_after_a_duplicate() -> None:
    # A and B hold the same content; A caches blocks 0-1 first, so B's blocks 0-1 stay
    # uncached (duplicates) and B caches 2-3. C hits A's 0-1 and B's block 2: B's segment is
    # split around block 2 and its other blocks keep their queue places (3 before 1, 0).
    ref, seg = BlockPool(10), SegmentPool(10)
    keys = chain([0, 0, 0, 0])
    pools: tuple[KVPool, KVPool] = (ref, seg)
    for p in pools:
        a = holder(keys, p.cache_for(None))
        b = holder(keys, p.cache_for(None))
        p.admit(a, [], 4)
        p.admit(b, [], 4)
        p.register(a, 2)
        p.register(b, 4)
        a.nreg, b.nreg = 2, 4
        p.release(a)
        p.release(b)
        c = holder(keys, p.cache_for(None))
        h, idle, tok = p.lookup(c.cache, keys, 3)
        assert (h, idle) == (3, 3)
        p.admit(c, tok, 1)
    expected = [None, None, None, keys[3], None, None]
    assert block_queue(ref) == segment_queue(seg) == expected


def test_decoder_filling_a_block_cached_elsewhere_leaves_it_uncached() -> None:
    # A caches blocks 0-3; B holds the same content in its own blocks and fills them one by one
    # (decode): they stay uncached. B is freed first, so its blocks are evicted first, and
    # evicting them must not drop A's cache entries.
    ref, seg = BlockPool(8), SegmentPool(8)
    keys = chain([5, 6, 7, 8])
    pools: tuple[KVPool, KVPool] = (ref, seg)
    for p in pools:
        a = holder(keys, p.cache_for(None))
        b = holder(keys, p.cache_for(None))
        p.admit(a, [], 4)
        p.register(a, 4)
        a.nreg = 4
        p.admit(b, [], 4)
        for _ in range(4):
            if p is seg:
                seg.fill_each([b])
            else:
                ref.register(b, b.nreg + 1)
                b.nreg += 1
        assert b.nreg == 4
        p.release(b)
        p.release(a)
        d = holder(chain([1, 2, 3, 4]), p.cache_for(None))
        p.admit(d, [], 4)  # evicts B's four blocks
        assert p.cached_keys(None) == set(keys)
    assert block_queue(ref) == segment_queue(seg) == keys[::-1]


def test_block_pool_reuses_blocks_without_a_key_deepest_first_last_freed_first() -> None:
    # vLLM 0.32: KVCacheManager.free passes a request's blocks deepest first to
    # BlockPool.free_blocks, which prepends those without a hash to the free queue in that
    # order (prepend_n), so the next allocation takes the last freed request's deepest one first
    p = BlockPool(8)
    a = holder(chain([1, 2, 3]), p.cache_for(None))
    c = holder(chain([4, 5]), p.cache_for(None))
    p.admit(a, [], 3)
    p.admit(c, [], 2)
    ablocks, cblocks = list(a.blocks), list(c.blocks)
    p.release(a)  # nothing offered to the cache (nreg 0): all go to the front
    p.release(c)
    assert p.allocate(5) == [*reversed(cblocks), *reversed(ablocks)]
