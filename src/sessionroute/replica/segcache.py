"""Run-length prefix cache of :class:`~sessionroute.replica.segments.SegmentPool`: per salt, one
dict entry per *run* of cached blocks, not per block.

Block keys are chained (``EngineRequest.block_keys``): the key at chain position ``p`` identifies
the whole content of blocks ``0..p``, so a key can only ever be cached at position ``p`` (block id
``(rix << 32) | p`` of some reservation), and two reservations with equal keys at ``p`` have
equal keys at every position before ``p``. A reservation *caches* position ``p`` when ``p`` lies
in one of its segments below ``creg`` and is not a hole (see
:mod:`sessionroute.replica.segstore`). A key is cached by at most one block.

A cached position ``p`` of reservation ``S`` is a **start** when ``S`` does not cache ``p - 1``.
The salt's :class:`SaltCache` (a dict) maps exactly the keys of starts to their block ids; the
other cached keys are implied by runs: ``S`` caches ``[a, b)`` with ``a`` a start. Lemma (from
chaining and uniqueness): if ``keys[p]`` is cached and ``keys[p - 1]`` is not cached by the same
reservation, it is a start. So

* a lookup walking a chain finds each next run with one dict probe (or as the continuation of
  its reservation in the next segment), then extends it by slice comparison;
* a registration of positions whose predecessor its own reservation caches can only collide
  with a start at the same position: the position index (``npos``, ``spos``) lists the
  positions that have starts, so a range with none is registered with no dict work at all;
* eviction and ``reset_prefix_cache`` drop only the starts inside the uncached range.

Per-block work remains only slice copies and comparisons and, for duplicate content,
run-length hole bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final

from sessionroute.replica.intbisect import bisect_left, bisect_right

if TYPE_CHECKING:
    from sessionroute.replica.segstore import _Res, _Seg

__all__ = [
    "SaltCache",
    "add_start",
    "audit",
    "cached_keys",
    "common_run",
    "drop_starts",
    "find_run",
    "restart",
    "run_end",
    "run_keys",
]

_SHIFT: Final = 32
_MASK: Final = (1 << _SHIFT) - 1


class SaltCache(dict[int, int]):
    """The cache of one ``cache_salt``: key -> block id of every start, plus a position index.

    Attributes:
        npos: chain position -> number of starts there.
        spos: the positions with starts, ascending.
    """

    __slots__ = ("npos", "spos")

    def __init__(self) -> None:
        super().__init__()
        self.npos: dict[int, int] = {}
        self.spos: list[int] = []

    def first_start_key(self, keys: list[int], p: int, top: int) -> int:
        """First position ``q`` in ``[p, top)`` whose ``keys[q]`` is a start key, else ``top``."""
        spos = self.spos
        j = bisect_left(spos, p)
        n = len(spos)
        while j < n:
            q = spos[j]
            if q >= top:
                return top
            if keys[q] in self:
                return q
            j += 1
        return top


def common_run(a: list[int], i: int, b: list[int], j: int, m: int) -> int:
    """Length of the common run of ``a[i:i+m]`` and ``b[j:j+m]`` (both at least ``m`` long).

    Keys are chained (equal keys at an offset mean equal keys at every smaller offset), so the
    run length is found by binary search: O(log m) comparisons, the last one first.
    """
    if m <= 0:
        return 0
    if a[i + m - 1] == b[j + m - 1]:
        return m
    if a[i] != b[j]:
        return 0
    lo = 1  # a[i + lo - 1] == b[j + lo - 1]
    hi = m - 1  # the run is at most hi long
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[i + mid - 1] == b[j + mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def run_keys(keys: list[int], a: int, b: int, holes: list[int]) -> list[int]:
    """``keys[a:b]`` without the positions in ``holes`` (sorted): the keys a segment caches
    over ``[a, b)`` (for KV cache events)."""
    if not holes or holes[-1] < a or holes[0] >= b:
        return keys[a:b]
    out: list[int] = []
    q = a
    for h in holes[bisect_left(holes, a) :]:
        if h >= b:
            break
        out += keys[q:h]
        q = h + 1
    out += keys[q:b]
    return out


def add_start(res: _Res, p: int) -> None:
    """Record position ``p`` of ``res`` (cached; ``res`` does not cache ``p - 1``) as a start."""
    cache: SaltCache = res.cache  # type: ignore[assignment]
    cache[res.keys[p]] = res.base | p
    st = res.starts
    if not st or st[-1] < p:
        st.append(p)
    else:
        st.insert(bisect_left(st, p), p)
    npos = cache.npos
    n = npos.get(p, 0)
    npos[p] = n + 1
    if not n:
        spos = cache.spos
        if not spos or spos[-1] < p:
            spos.append(p)
        else:
            spos.insert(bisect_left(spos, p), p)


def drop_starts(res: _Res, lo: int, hi: int) -> None:
    """Forget the starts of ``res`` at positions ``[lo, hi)`` (they stop being cached)."""
    st = res.starts
    if not st or st[-1] < lo:
        return
    j = bisect_left(st, lo)
    k = bisect_left(st, hi)
    if j == k:
        return
    cache: SaltCache = res.cache  # type: ignore[assignment]
    npos = cache.npos
    keys = res.keys
    for p in st[j:k]:
        del cache[keys[p]]
        n = npos[p] - 1
        if n:
            npos[p] = n
        else:
            del npos[p]
            spos = cache.spos
            del spos[bisect_left(spos, p)]
    del st[j:k]


def seg_caches(seg: _Seg, p: int) -> bool:
    """Whether ``seg`` caches position ``p``."""
    if not seg.lo <= p < seg.creg or p >= seg.hi:
        return False
    holes = seg.holes
    if not holes or holes[-1] < p:
        return True
    k = bisect_left(holes, p)
    return holes[k] != p


def restart(res: _Res, i: int) -> None:
    """Segment ``i`` of ``res`` lost its cached predecessor: its first position, if cached and
    not a start yet, becomes one."""
    seg = res.segs[i]
    lo = seg.lo
    if not seg_caches(seg, lo):
        return
    st = res.starts
    j = bisect_left(st, lo)
    if j < len(st) and st[j] == lo:
        return
    add_start(res, lo)


def run_end(res: _Res, p: int, keys: list[int], limit: int, touch: Callable[[_Res], None]) -> int:
    """End ``x`` of the run ``res`` caches from position ``p`` with keys equal to ``keys``:
    ``res`` caches ``[p, x)``, ``res.keys[p:x] == keys[p:x]``, ``x <= limit`` (``p`` if none).

    ``touch`` is called on a lazy ``res`` (see ``SegmentStore.touch``) before the run is
    extended into its last segment (whose extent and cached run may be kept lazily); a run
    whose key differs at the segment's start ends there whatever the segment holds.
    """
    lows = res.lows
    segs = res.segs
    i = bisect_right(lows, p) - 1
    if i < 0:
        return p
    rkeys = res.keys
    x = p
    n = len(segs)
    while True:
        seg = segs[i]
        if seg.lo > x:
            return x
        if res.lazy and i == n - 1 and x < limit and x < len(rkeys) and keys[x] == rkeys[x]:
            touch(res)
        hi = seg.hi
        end = seg.creg if seg.creg < hi else hi
        holes = seg.holes
        if holes and holes[-1] >= x:
            h = holes[bisect_left(holes, x)]
            if h < end:
                end = h
        if end > limit:
            end = limit
        if end <= x:
            return x
        x += common_run(keys, x, rkeys, x, end - x)
        if x < end or end != hi:
            return x
        i += 1
        if i == n:
            return x


def find_run(
    cache: SaltCache,
    resmap: dict[int, _Res],
    keys: list[int],
    p: int,
    limit: int,
    touch: Callable[[_Res], None],
) -> tuple[_Res | None, int]:
    """Who caches ``keys[p]``: ``(S, x)`` with ``S`` caching ``[p, x)`` under ``keys`` (``x``
    capped at ``limit > p``), or ``(None, p)`` if nobody does.

    Walks the start positions at or below ``p`` downwards: the first whose key is ``keys``' own
    is the only reservation that can cache ``keys[p]`` (chained keys). ``touch`` as in
    :func:`run_end`.

    Raises:
        RuntimeError: if a start key sits at another position than its chain index (keys that
            are not chained).
    """
    spos = cache.spos
    j = bisect_right(spos, p)
    while j:
        j -= 1
        q = spos[j]
        b = cache.get(keys[q])
        if b is None:
            continue
        if b & _MASK != q:
            raise RuntimeError(f"key at chain position {q} is cached at {b & _MASK}")
        s = resmap[b >> _SHIFT]
        x = run_end(s, q, keys, limit, touch)
        return (s, x) if x > p else (None, p)
    return None, p


# ------------------------------------------------------------ inspection (tests)


def positions(res: _Res) -> set[int]:
    """The positions ``res`` caches."""
    out: set[int] = set()
    for seg in res.segs:
        top = seg.creg if seg.creg < seg.hi else seg.hi
        holes = set(seg.holes)
        out.update(p for p in range(seg.lo, top) if p not in holes)
    return out


def cached_keys(reservations: Iterable[_Res], cache: SaltCache) -> set[int]:
    """Every key cached in ``cache`` by ``reservations`` (expands the runs)."""
    out: set[int] = set()
    for res in reservations:
        if res.cache is cache:
            out.update(res.keys[p] for p in positions(res))
    return out


def audit(reservations: Iterable[_Res], caches: Iterable[SaltCache]) -> None:
    """Check the start entries, ``res.starts`` and the position index against the segments.

    Raises:
        RuntimeError: if a key is cached twice, a start is missing or extra, or the position
            index disagrees.
    """
    want: dict[int, dict[int, int]] = {}
    for res in reservations:
        cached = positions(res)
        starts = sorted(p for p in cached if p - 1 not in cached)
        if starts != res.starts:
            raise RuntimeError(f"reservation {res.rix}: starts {res.starts} != {starts}")
        entries = want.setdefault(id(res.cache), {})
        for p in cached:
            k = res.keys[p]
            if k in entries:
                raise RuntimeError(f"key {k} cached twice")
            entries[k] = res.base | p if p in starts else -1
    for cache in caches:
        entries = want.get(id(cache), {})
        starts_only = {k: b for k, b in entries.items() if b >= 0}
        if dict(cache) != starts_only:
            raise RuntimeError("start entries disagree with the segments")
        npos: dict[int, int] = {}
        for b in starts_only.values():
            npos[b & _MASK] = npos.get(b & _MASK, 0) + 1
        if cache.npos != npos or cache.spos != sorted(npos):
            raise RuntimeError("position index disagrees with the start entries")
