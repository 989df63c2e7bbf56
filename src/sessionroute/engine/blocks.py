"""KV block pool with prefix caching, after vLLM V1 ``v1/core/block_pool.py``.

Blocks hold ``block_size`` tokens. A full block whose content has a key is *cached*: its key maps
to it in the cache of the request's ``cache_salt`` (one dict per salt, so different salts never
share). A block nobody uses (``ref == 0``) sits in the LRU free queue, cached or not; allocation
pops the queue head and evicts the popped block's key. A hit takes the block out of the queue
(``touch``). A finished or preempted request's blocks are freed deepest first, so its deepest
block is evicted first. The queue is a deque with lazy deletion: an entry is live only while its
version matches the block's.

Deviation from vLLM: when a block fills with content whose key is already cached by another
block, vLLM keeps both under the key; here the new block stays uncached (no duplicate keys).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice

__all__ = ["Block", "BlockPool"]


class Block:
    """One KV block.

    Attributes:
        cache: the salt's cache dict that maps ``key`` to this block, or None if uncached.
        key: the block's chained key (meaningful only while ``cache`` is set).
        ref: number of running requests using it.
        ver: version; a free-queue entry ``(block, ver)`` is live only while it matches.
    """

    __slots__ = ("cache", "key", "ref", "ver")

    def __init__(self) -> None:
        self.cache: dict[int, Block] | None = None
        self.key = 0
        self.ref = 1
        self.ver = 0


class BlockPool:
    """Fixed number of blocks, an LRU free queue and per-salt prefix caches.

    Args:
        num_blocks: blocks in the pool (``kv_capacity_tokens // block_size``), >= 1.

    Attributes:
        num_blocks: total blocks.
        num_free: blocks with ``ref == 0`` (free, cached or not), vLLM ``get_num_free_blocks``.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self._virgin = num_blocks  # never-used blocks, at the head of the free queue
        self._queue: deque[tuple[Block, int]] = deque()
        self._caches: dict[str | None, dict[int, Block]] = {}

    def cache_for(self, salt: str | None) -> dict[int, Block]:
        """The cache dict (key -> block) of a ``cache_salt``."""
        cache = self._caches.get(salt)
        if cache is None:
            cache = self._caches[salt] = {}
        return cache

    @staticmethod
    def hit_blocks(cache: dict[int, Block], keys: Sequence[int], limit: int) -> list[Block]:
        """Longest cached prefix of a key chain (vLLM ``find_longest_cache_hit``).

        Args:
            cache: the salt's cache.
            keys: chained block keys.
            limit: most blocks to return (e.g. ``(num_tokens - 1) // block_size``).

        Returns:
            The cached blocks of keys ``0..h-1`` for the largest such ``h <= limit``.
        """
        out: list[Block] = []
        get = cache.get
        append = out.append
        for key in islice(keys, limit):
            block = get(key)
            if block is None:
                break
            append(block)
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a hit's blocks into use: out of the free queue if idle, ``ref += 1``."""
        taken = 0
        for block in blocks:
            if block.ref == 0:
                block.ver += 1
                taken += 1
            block.ref += 1
        self.num_free -= taken

    def allocate(self, n: int) -> list[Block]:
        """Pop ``n`` blocks from the free-queue head, evicting their keys (``ref`` becomes 1).

        Raises:
            ValueError: if fewer than ``n`` blocks are free (callers check ``num_free``).
        """
        if n > self.num_free:
            raise ValueError(f"cannot allocate {n} blocks, {self.num_free} free")
        self.num_free -= n
        out: list[Block] = []
        if self._virgin:
            fresh = n if n < self._virgin else self._virgin
            self._virgin -= fresh
            out = [Block() for _ in range(fresh)]
            n -= fresh
        popleft = self._queue.popleft
        append = out.append
        while n:
            block, ver = popleft()
            if ver != block.ver:
                continue
            cache = block.cache
            if cache is not None:
                del cache[block.key]
                block.cache = None
            block.ver = ver + 1
            block.ref = 1
            append(block)
            n -= 1
        return out

    def free(self, blocks: Sequence[Block]) -> None:
        """Release a request's blocks, deepest first; idle ones join the queue tail."""
        append = self._queue.append
        freed = 0
        for block in reversed(blocks):
            block.ref -= 1
            if block.ref == 0:
                ver = block.ver + 1
                block.ver = ver
                append((block, ver))
                freed += 1
        self.num_free += freed

    def reset_prefix_cache(self) -> int:
        """Uncache every idle block (vLLM ``reset_prefix_cache``); returns how many."""
        dropped = 0
        for block, ver in self._queue:
            if ver == block.ver and block.cache is not None:
                del block.cache[block.key]
                block.cache = None
                dropped += 1
        return dropped

    @staticmethod
    def register(cache: dict[int, Block], key: int, block: Block) -> None:
        """Cache a full block under ``key`` unless the key is cached already."""
        if key not in cache:
            cache[key] = block
            block.cache = cache
            block.key = key

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (``vllm:kv_cache_usage_perc``; idle cached blocks excluded)."""
        return (self.num_blocks - self.num_free) / self.num_blocks
