"""KV block pool with prefix caching, after vLLM V1 ``v1/core/block_pool.py``.

Blocks hold ``block_size`` tokens and are integer ids ``0..num_blocks-1`` with per-block state
in parallel lists (no per-block objects).
A full block whose content has a key is *cached*: its key maps to it in the cache of the
request's ``cache_salt`` (one dict per salt, so different salts never share). A block nobody
uses (``ref == 0``) sits in the LRU free queue if it was offered to the cache (cached, or a
duplicate, below); allocation takes blocks never offered to the cache first (never used, or the
partial tail a request freed: vLLM 0.32 ``free_blocks`` puts blocks without a hash at the front of
its free queue), then pops the queue head and evicts the popped block's key. A hit takes the block
out of the queue (``touch``). A finished or preempted request's blocks are freed deepest first, so
its deepest block is evicted first. The queue is a deque of ``(version << 32) | block`` entries
with lazy deletion: an entry is live only while its version matches the block's.

Deviation from vLLM: when a block fills with content whose key is already cached by another
block, vLLM keeps both under the key; here the new block stays uncached (no duplicate keys).

The scheduler talks to a pool through the request-level :class:`KVPool` interface (``lookup``,
``admit``, ``grow``, ``register``, ``release``); :class:`BlockPool` is its per-block reference
implementation and :class:`~sessionroute.replica.segments.SegmentPool` the run-length one the fast
path uses (same results, per-block work only for blocks created or evicted).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any, Final

__all__ = ["BlockPool", "Holder", "KVListener", "KVPool"]

KVListener = Callable[[bool, list[int], str | None], None]
"""A pool's KV cache event hook: ``(stored, keys, salt)``. ``stored`` True: ``keys`` (chain
order) entered the prefix cache of ``salt`` (vLLM ``BlockStored``); False: they left it
(``BlockRemoved``). Called synchronously from the pool's hot path, only when set."""

_ID_BITS: Final = 32
_ID_MASK: Final = (1 << _ID_BITS) - 1


class Holder:
    """What a pool needs of a request: the base of the scheduler's ``Req``.

    A base class rather than a ``Protocol``: the pools read these attributes as declared
    fields.

    Args:
        keys: chained block keys of prompt + output.
        nkeys: usable keys (blocks beyond are never cached).
        cache: the cache dict of the request's ``cache_salt``.

    Attributes:
        blocks: the pool's record of the request's blocks (pool-specific; empty when none).
        nblocks: number of blocks the request holds.
        nreg: leading blocks already offered to the cache (the scheduler advances it; the
            fast path's ``fill_each`` too).
    """

    __slots__ = ("blocks", "cache", "keys", "nblocks", "nkeys", "nreg")

    def __init__(self, keys: list[int], nkeys: int, cache: dict[int, int]) -> None:
        self.keys = keys
        self.nkeys = nkeys
        self.cache = cache
        self.blocks: list[Any] = []
        self.nblocks = 0
        self.nreg = 0


class KVPool:
    """Request-level interface of a KV block pool (what :class:`~sessionroute.replica.core.Core`
    uses): the base class of :class:`BlockPool` and
    :class:`~sessionroute.replica.segments.SegmentPool` (a base class rather than a
    ``Protocol``, so calls through it are calls of declared methods). Every method keeps vLLM V1
    ``block_pool.py`` semantics as described in the module docstring; implementations give
    identical results.

    Attributes:
        num_blocks: total blocks.
        num_free: blocks with no user (free or cached-idle), vLLM ``get_num_free_blocks``.
    """

    num_blocks: int
    num_free: int
    kv_listener: KVListener | None
    """Called with every change of the cached key set when set (:data:`KVListener`); None,
    the default, costs one attribute test per change."""

    def cache_for(self, salt: str | None) -> dict[int, int]:
        """The cache dict of a ``cache_salt``."""
        raise NotImplementedError

    def lookup(self, cache: dict[int, int], keys: list[int], limit: int) -> tuple[int, int, Any]:
        """Longest cached prefix of ``keys`` (at most ``limit`` blocks), without side effects.

        Returns:
            ``(hit_blocks, idle_hit_blocks, token)``; ``token`` goes to :meth:`admit`.
        """
        raise NotImplementedError

    def admit(self, r: Holder, token: Any, new: int) -> None:
        """Take a lookup's hit blocks into use and allocate ``new`` more (``r`` held none)."""
        raise NotImplementedError

    def grow(self, r: Holder, n: int) -> None:
        """Allocate ``n`` blocks at the end of ``r``'s chain (evicting from the queue head)."""
        raise NotImplementedError

    def grow_each(self, rs: Sequence[Holder]) -> None:
        """Allocate one block for each of ``rs``, in order."""
        raise NotImplementedError

    def register(self, r: Holder, full: int) -> None:
        """Offer ``r``'s blocks ``r.nreg .. full - 1`` to the cache (``full <= r.nkeys``)."""
        raise NotImplementedError

    def release(self, r: Holder) -> None:
        """Free all of ``r``'s blocks, deepest first (finish, preemption or abort)."""
        raise NotImplementedError

    def reset_prefix_cache(self) -> int:
        """Uncache every idle block; returns how many."""
        raise NotImplementedError

    def cached_keys(self, salt: str | None) -> set[int]:
        """Every key cached under ``salt`` (for tests and debugging)."""
        raise NotImplementedError

    @property
    def usage(self) -> float:
        """Fraction of blocks in use."""
        raise NotImplementedError


class BlockPool(KVPool):
    """Fixed number of blocks, an LRU free queue and per-salt prefix caches.

    Args:
        num_blocks: blocks in the pool (``kv_capacity_tokens // block_size``), 1 to 2**32.

    Attributes:
        num_blocks: total blocks.
        num_free: blocks with ``ref == 0`` (free, cached or not), vLLM ``get_num_free_blocks``.
        ref: per block, the number of running requests using it.
        owner: per block, the cache dict that maps its key to it, or None if uncached.
        key: per block, its key (meaningful only while ``owner`` is set).
    """

    def __init__(self, num_blocks: int) -> None:
        if not 1 <= num_blocks <= _ID_MASK:
            raise ValueError(f"num_blocks must be in [1, 2**32), got {num_blocks}")
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self._next = 0  # never-used blocks are _next.., at the head of the free queue
        self._spare: list[int] = []  # idle blocks a request freed without offering them
        self.ref = [0] * num_blocks
        self.ver = [0] * num_blocks
        self.key = [0] * num_blocks
        self.owner: list[dict[int, int] | None] = [None] * num_blocks
        self._queue: deque[int] = deque()
        self._caches: dict[str | None, dict[int, int]] = {}
        self._salt_of: dict[int, str | None] = {}  # id(cache dict) -> its salt (events)
        self.kv_listener = None

    def cache_for(self, salt: str | None) -> dict[int, int]:
        """The cache dict (key -> block) of a ``cache_salt``."""
        cache = self._caches.get(salt)
        if cache is None:
            cache = self._caches[salt] = {}
            self._salt_of[id(cache)] = salt
        return cache

    def _removed(self, cache: dict[int, int], k: int) -> None:
        listener = self.kv_listener
        if listener is not None:
            listener(False, [k], self._salt_of.get(id(cache)))

    @staticmethod
    def hit_blocks(cache: dict[int, int], keys: list[int], limit: int) -> list[int]:
        """Longest cached prefix of a key chain (vLLM ``find_longest_cache_hit``).

        Args:
            cache: the salt's cache.
            keys: chained block keys.
            limit: most blocks to return (e.g. ``(num_tokens - 1) // block_size``).

        Returns:
            The cached blocks of keys ``0..h-1`` for the largest such ``h <= limit``.
        """
        out: list[int] = []
        for k in islice(keys, limit):
            b = cache.get(k)
            if b is None:
                break
            out.append(b)
        return out

    def num_idle(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are idle (``ref == 0``), i.e. count against the free blocks."""
        ref = self.ref
        return [ref[b] for b in blocks].count(0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a hit's blocks into use: out of the free queue if idle, ``ref += 1``."""
        ref = self.ref
        ver = self.ver
        taken = 0
        for b in blocks:
            r = ref[b]
            if r == 0:
                ver[b] += 1
                taken += 1
            ref[b] = r + 1
        self.num_free -= taken

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks (``ref`` becomes 1): blocks never offered to the cache first
        (freed ones, then never-used ones), then from the free-queue head, evicting their keys.

        Raises:
            ValueError: if fewer than ``n`` blocks are free (callers check ``num_free``).
        """
        if n > self.num_free:
            raise ValueError(f"cannot allocate {n} blocks, {self.num_free} free")
        self.num_free -= n
        ref = self.ref
        out: list[int] = []
        spare = self._spare
        while spare and n:
            b = spare.pop()
            ref[b] = 1
            out.append(b)
            n -= 1
        nxt = self._next
        if n and nxt < self.num_blocks:
            fresh = min(n, self.num_blocks - nxt)
            self._next = nxt + fresh
            ref[nxt : nxt + fresh] = [1] * fresh
            out += range(nxt, nxt + fresh)
            n -= fresh
        if not n:
            return out
        queue = self._queue
        ver = self.ver
        owner = self.owner
        key = self.key
        while n:
            e = queue.popleft()
            b = e & _ID_MASK
            v = e >> _ID_BITS
            if v != ver[b]:
                continue
            cache = owner[b]
            if cache is not None:
                del cache[key[b]]
                owner[b] = None
                if self.kv_listener is not None:
                    self._removed(cache, key[b])
            ver[b] = v + 1
            ref[b] = 1
            out.append(b)
            n -= 1
        return out

    def free(self, blocks: Sequence[int]) -> None:
        """Release a request's blocks, deepest first; idle ones join the queue tail."""
        self._unuse(reversed(blocks), True)

    def _unuse(self, blocks: Iterable[int], offered: bool) -> None:
        """Drop one use of each of ``blocks``, in the order given. Each that becomes idle gets
        a new version (no queue entry of an earlier idle spell stays live) and joins, if
        ``offered`` to the cache, the free queue's tail (evicted in LRU order), else
        the spare stack (taken before any queued block, the last pushed first)."""
        ref = self.ref
        ver = self.ver
        queue = self._queue
        spare = self._spare
        freed = 0
        for b in blocks:
            left = ref[b] - 1
            ref[b] = left
            if left == 0:
                v = ver[b] + 1
                ver[b] = v
                if offered:
                    queue.append((v << _ID_BITS) | b)
                else:
                    spare.append(b)
                freed += 1
        self.num_free += freed

    # ------------------------------------------------------------ request level (KVPool)

    def lookup(
        self, cache: dict[int, int], keys: list[int], limit: int
    ) -> tuple[int, int, list[int]]:
        """:meth:`KVPool.lookup`: the hit blocks as the token."""
        hits = self.hit_blocks(cache, keys, limit)
        return len(hits), self.num_idle(hits) if hits else 0, hits

    def admit(self, r: Holder, token: list[int], new: int) -> None:
        """:meth:`KVPool.admit`."""
        self.touch(token)
        if new > 0:
            token += self.allocate(new)
        r.blocks = token
        r.nblocks = len(token)

    def grow(self, r: Holder, n: int) -> None:
        """:meth:`KVPool.grow`."""
        r.blocks += self.allocate(n)
        r.nblocks += n

    def grow_each(self, rs: Sequence[Holder]) -> None:
        """:meth:`KVPool.grow_each`."""
        for r, b in zip(rs, self.allocate(len(rs)), strict=True):
            r.blocks.append(b)
            r.nblocks += 1

    def register(self, r: Holder, full: int) -> None:
        """:meth:`KVPool.register`: each block is cached under its key unless the key is
        cached already."""
        cache = r.cache
        keys = r.keys
        blocks = r.blocks
        owner = self.owner
        bkey = self.key
        stored: list[int] | None = [] if self.kv_listener is not None else None
        for i in range(r.nreg, full):
            k = keys[i]
            if k not in cache:
                b = blocks[i]
                cache[k] = b
                owner[b] = cache
                bkey[b] = k
                if stored is not None:
                    stored.append(k)
        listener = self.kv_listener
        if listener is not None and stored:
            listener(True, stored, self._salt_of.get(id(cache)))

    def release(self, r: Holder) -> None:
        """:meth:`KVPool.release`: the blocks ``r`` offered to the cache (its first ``nreg``)
        join the queue tail deepest first; the rest (a partial tail, blocks past its keys) are
        taken before any queued block, deepest first, before those of requests freed earlier
        (vLLM 0.32 ``BlockPool.free_blocks``: blocks without a hash, passed deepest first, are
        prepended to the free queue in that order)."""
        blocks: list[int] = r.blocks
        nreg = r.nreg
        if nreg < len(blocks):
            # shallowest first onto the stack, so that allocate pops the deepest first
            self._unuse(islice(blocks, nreg, None), False)
            blocks = blocks[:nreg]
        self.free(blocks)
        r.blocks = []
        r.nblocks = 0

    def reset_prefix_cache(self) -> int:
        """Uncache every idle block (vLLM ``reset_prefix_cache``); returns how many."""
        dropped = 0
        ver = self.ver
        owner = self.owner
        for e in self._queue:
            b = e & _ID_MASK
            cache = owner[b]
            if e >> _ID_BITS == ver[b] and cache is not None:
                del cache[self.key[b]]
                owner[b] = None
                dropped += 1
                if self.kv_listener is not None:
                    self._removed(cache, self.key[b])
        return dropped

    def cached_keys(self, salt: str | None) -> set[int]:
        """Every key cached under ``salt`` (for tests and debugging)."""
        return set(self._caches.get(salt, {}))

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (``vllm:kv_cache_usage_perc``; idle cached blocks excluded)."""
        return (self.num_blocks - self.num_free) / self.num_blocks
