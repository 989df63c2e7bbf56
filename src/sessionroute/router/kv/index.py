"""Per-replica sets of cached KV block hashes, learned from vLLM's KV cache events.

:class:`KvIndex` keeps, for each worker, the block hashes its prefix cache holds (an
insertion-ordered dict, oldest first, bounded by ``max_blocks_per_worker``: past the bound the
oldest entries are forgotten, so memory is bounded whatever the event stream does) and, for all
workers together, ``hash -> bitmask of worker slots``, so one request is matched against every
worker at once.

Matching (:meth:`KvIndex.matched_blocks`) finds, per worker, the length of the longest run of
the request's leading block hashes the worker holds. It assumes each worker's set is
*prefix-closed* along a chain (holding block ``i`` of a prompt implies holding blocks
``0..i-1``): vLLM frees a request's blocks deepest first and a cache hit touches a chain from its
head, so its LRU evicts a chain from the tail (``vllm/v1/core/block_pool.py``,
``free_blocks``). Under that assumption the lengths are found by a binary search that splits the
workers by whether they hold the middle block: a few dictionary probes per distinct length,
independent of the prompt's length. Where a set is not prefix-closed the length found is still
a position the worker holds.

Sequence numbers: each worker's publisher numbers its batches 0, 1, 2, ...; :meth:`KvIndex.apply`
reports a gap (a batch lost between publisher and subscriber, or a publisher restart), and the
caller resyncs (replays the missed batches, or :meth:`KvIndex.clear` and relearns).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sessionroute.errors import ConfigError
from sessionroute.router.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

__all__ = ["Applied", "IndexStats", "KvIndex", "PrefixCacheView"]


class PrefixCacheView(Protocol):
    """What a policy asks about the replicas' prefix caches."""

    def matched_blocks(
        self, hashes: Sequence[int], workers: Sequence[str], salt: str | None = None
    ) -> dict[str, int]:
        """How many leading blocks of ``hashes`` each of ``workers`` holds, for the workers
        holding at least one (the others are absent: usually most of them).

        ``salt`` is the request's ``cache_salt``: a view whose hashes already include it
        (vLLM's, hence :class:`KvIndex`) ignores it; the simulator's view needs it to pick the
        replica's cache namespace.
        """
        ...


class Applied(enum.Enum):
    """What :meth:`KvIndex.apply` did with a batch."""

    APPLIED = "applied"
    """In order (or the first batch seen): applied."""
    GAP = "gap"
    """Batches were missed before this one: applied, but the caller should resync."""
    STALE = "stale"
    """Already seen (a duplicate or a replayed batch): ignored."""


@dataclass(slots=True)
class IndexStats:
    """Counters of one worker's event stream (exported as ``sessionroute_kv_*`` metrics).

    Attributes:
        batches: batches applied.
        stored: block hashes stored (including re-stores of cached blocks).
        removed: block hashes removed.
        cleared: ``AllBlocksCleared`` events and resyncs that cleared the set.
        gaps: sequence gaps detected.
        dropped: hashes forgotten because the set was at its bound.
    """

    batches: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    gaps: int = 0
    dropped: int = 0


class KvIndex:
    """Block hashes cached per worker (see the module docstring).

    Args:
        max_blocks_per_worker: bound of each worker's set; the oldest entries beyond it are
            forgotten (default 2**20 blocks, about 100 MB per worker at the bound).

    Raises:
        ConfigError: if ``max_blocks_per_worker < 1``.
    """

    def __init__(self, max_blocks_per_worker: int = 1 << 20) -> None:
        if max_blocks_per_worker < 1:
            raise ConfigError(f"max_blocks_per_worker must be >= 1, got {max_blocks_per_worker}")
        self.max_blocks = max_blocks_per_worker
        self._blocks: dict[str, dict[int, None]] = {}
        self._slot: dict[str, int] = {}
        self._owners: dict[int, int] = {}  # hash -> bitmask of worker slots holding it
        self._seq: dict[str, int] = {}
        self._names: dict[int, str] = {}  # slot -> worker
        self._version = 0  # bumped when slots change (invalidates the cached worker mask)
        self._mask_of: tuple[object, int, int] = ((), -1, 0)
        self.stats: dict[str, IndexStats] = {}

    # -- feeding --------------------------------------------------------------------------
    def add_worker(self, worker: str) -> None:
        """Start tracking ``worker`` (an empty set); a no-op when tracked."""
        if worker in self._blocks:
            return
        used = set(self._slot.values())
        slot = next(i for i in range(len(used) + 1) if i not in used)
        self._slot[worker] = slot
        self._names[slot] = worker
        self._version += 1
        self._blocks[worker] = {}
        self.stats.setdefault(worker, IndexStats())

    def remove_worker(self, worker: str) -> None:
        """Forget ``worker`` and everything it held (its slot is reused)."""
        if worker not in self._blocks:
            return
        self.clear(worker, count=False)
        del self._blocks[worker]
        del self._names[self._slot.pop(worker)]
        self._version += 1
        self._seq.pop(worker, None)

    def workers(self) -> list[str]:
        """The tracked workers."""
        return list(self._blocks)

    def size(self, worker: str) -> int:
        """How many block hashes ``worker`` is known to hold (0 if untracked)."""
        blocks = self._blocks.get(worker)
        return 0 if blocks is None else len(blocks)

    def last_seq(self, worker: str) -> int | None:
        """The last applied sequence number of ``worker``'s stream, or None."""
        return self._seq.get(worker)

    def apply(self, worker: str, seq: int, batch: KVEventBatch) -> Applied:
        """Apply one published batch of ``worker`` (tracked on first use).

        Args:
            worker: the worker the batch came from.
            seq: the batch's sequence number.
            batch: the decoded batch.

        Returns:
            :attr:`Applied.STALE` (``seq`` not after the last applied one: ignored),
            :attr:`Applied.GAP` (``seq`` skips ahead: applied, the caller should resync), or
            :attr:`Applied.APPLIED`.
        """
        self.add_worker(worker)
        last = self._seq.get(worker)
        if last is not None and seq <= last:
            return Applied.STALE
        result = Applied.APPLIED
        if last is not None and seq != last + 1:
            self.stats[worker].gaps += 1
            result = Applied.GAP
        self._seq[worker] = seq
        self.apply_events(worker, batch.events)
        self.stats[worker].batches += 1
        return result

    def apply_events(
        self, worker: str, events: Iterable[BlockStored | BlockRemoved | AllBlocksCleared]
    ) -> None:
        """Apply events to ``worker``'s set without sequence bookkeeping (the simulator's
        replicas and tests feed the index this way)."""
        self.add_worker(worker)
        for e in events:
            if isinstance(e, BlockStored):
                if e.medium is None or e.medium == "GPU":
                    self.store(worker, e.block_hashes)
            elif isinstance(e, BlockRemoved):
                if e.medium is None or e.medium == "GPU":
                    self.remove(worker, e.block_hashes)
            else:
                self.clear(worker)

    def store(self, worker: str, hashes: Iterable[int]) -> None:
        """``worker`` holds ``hashes`` (a re-store refreshes an entry's age)."""
        self.add_worker(worker)
        blocks = self._blocks[worker]
        bit = 1 << self._slot[worker]
        owners = self._owners
        st = self.stats[worker]
        n = 0
        for h in hashes:
            n += 1
            if h in blocks:
                del blocks[h]  # re-inserted below: now the newest
            else:
                owners[h] = owners.get(h, 0) | bit
            blocks[h] = None
        st.stored += n
        excess = len(blocks) - self.max_blocks
        if excess > 0:
            it = iter(blocks)
            self._drop(blocks, bit, [next(it) for _ in range(excess)])
            st.dropped += excess

    def remove(self, worker: str, hashes: Iterable[int]) -> None:
        """``worker`` evicted ``hashes`` (unknown ones are ignored)."""
        blocks = self._blocks.get(worker)
        if blocks is None:
            return
        gone = [h for h in hashes if h in blocks]
        self._drop(blocks, 1 << self._slot[worker], gone)
        self.stats[worker].removed += len(gone)

    def clear(self, worker: str, *, count: bool = True) -> None:
        """Forget everything ``worker`` holds (``AllBlocksCleared``, or a resync)."""
        blocks = self._blocks.get(worker)
        if blocks is None:
            return
        self._drop(blocks, 1 << self._slot[worker], list(blocks))
        if count:
            self.stats[worker].cleared += 1

    def restart_stream(self, worker: str) -> None:
        """Forget ``worker``'s last sequence number (its publisher restarted, or the caller
        resynced by clearing): the next batch is taken as the first."""
        self._seq.pop(worker, None)

    def _drop(self, blocks: dict[int, None], bit: int, hashes: Iterable[int]) -> None:
        owners = self._owners
        keep = ~bit
        for h in hashes:
            del blocks[h]
            m = owners[h] & keep
            if m:
                owners[h] = m
            else:
                del owners[h]

    # -- matching -------------------------------------------------------------------------
    def holds(self, worker: str, h: int) -> bool:
        """Whether ``worker`` holds block hash ``h``."""
        blocks = self._blocks.get(worker)
        return blocks is not None and h in blocks

    def matched_blocks(
        self, hashes: Sequence[int], workers: Sequence[str], salt: str | None = None
    ) -> dict[str, int]:
        """Worker -> number of leading blocks of ``hashes`` it holds, for those of ``workers``
        holding at least one (prefix-closed sets assumed, see the module docstring).
        ``salt`` is ignored: vLLM's hashes include it."""
        n = len(hashes)
        if not n:
            return {}
        owners = self._owners
        first = owners.get(hashes[0], 0)
        if not first:
            return {}
        if workers is self._mask_of[0] and self._mask_of[1] == self._version:
            mask = self._mask_of[2]
        else:
            slot = self._slot
            mask = 0
            for w in workers:
                s = slot.get(w)
                if s is not None:
                    mask |= 1 << s
            self._mask_of = (workers, self._version, mask)
        lengths: dict[int, int] = {}
        if first & mask:
            # invariant of each item: every slot in m holds a prefix of length in [lo, hi]
            stack = [(1, n, first & mask)]
            while stack:
                lo, hi, m = stack.pop()
                while lo < hi:
                    mid = (lo + hi + 1) >> 1
                    held = owners.get(hashes[mid - 1], 0) & m
                    rest = m & ~held
                    if rest:
                        stack.append((lo, mid - 1, rest))
                    if not held:
                        m = 0
                        break
                    lo, m = mid, held
                if m:
                    while m:
                        low = m & -m
                        lengths[low.bit_length() - 1] = lo
                        m ^= low
        names = self._names
        return {names[s]: m for s, m in lengths.items()}
