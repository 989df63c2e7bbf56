"""The simulated replicas' KV cache events, fed into the router's own KV index.

Live, ``kv_aware`` learns each replica's cache from vLLM's KV events through
:class:`~sessionroute.router.kv.KvIndex`. The simulator does the same: each simulated engine
reports every change of its prefix cache (:meth:`sessionroute.replica.Replica.set_kv_listener`),
:class:`KvEventFeed` turns each report into vLLM's ``BlockStored`` / ``BlockRemoved`` and applies
it to the policy's ``KvIndex`` through :meth:`~sessionroute.router.kv.KvIndex.apply_events` (the
code ``serve``'s ZMQ subscribers feed), and a replica that fails is ``AllBlocksCleared``. The
stream is lossless and has no delay (no sequence gaps to resync); a block being decoded is
announced when the engine next brings its blocks up to date, at the latest when its request
finishes.

Block identities: the simulated request's content is the workload's chained block keys (key
``i`` identifies the prompt's tokens ``0 .. (i + 1) * block_size``; two prompts share key ``i``
exactly when vLLM would give them the same hash ``i``), and the engine caches and reports the
same keys, so the router and the replicas compute the same identities with no tokenizer. vLLM's
hashes include the request's ``cache_salt`` in the first block; here an event of a salted block
carries :func:`salted_keys` of its keys, and :class:`SaltedIndexView` applies the same function
to a salted request's keys before asking the index. The router's content blocks must be the
replicas' KV blocks (``router.content_block_tokens`` must divide the replicas' ``block_size``;
with equal sizes, the default, the keys are passed through as they are).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import overload

from sessionroute.errors import ConfigError
from sessionroute.router.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from sessionroute.router.kv.index import KvIndex
from sessionroute.sim.replicas import SimReplica

__all__ = ["KvEventFeed", "SaltedIndexView", "salted_keys"]

_MASK64 = (1 << 64) - 1


def salted_keys(keys: Sequence[int], salt: str) -> list[int]:
    """Block identities of ``keys`` under ``cache_salt`` ``salt`` (deterministic: the salt's
    CRC-32 mixed into each key), distinct from the unsalted keys as vLLM's salted hashes are."""
    s = zlib.crc32(salt.encode("utf-8", "surrogatepass"))
    return [hash((s, k)) & _MASK64 for k in keys]


class _SaltedKeys(Sequence[int]):
    """:func:`salted_keys` of ``keys``, computed per item as read: the index's binary search
    reads a few items of a prompt's thousands."""

    __slots__ = ("_keys", "_s")

    def __init__(self, keys: Sequence[int], salt: str) -> None:
        self._keys = keys
        self._s = zlib.crc32(salt.encode("utf-8", "surrogatepass"))

    def __len__(self) -> int:
        return len(self._keys)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return [hash((self._s, k)) & _MASK64 for k in self._keys[i]]
        return hash((self._s, self._keys[i])) & _MASK64


class SaltedIndexView:
    """:class:`~sessionroute.router.kv.PrefixCacheView` over a :class:`KvIndex` fed with
    :func:`salted_keys` identities: a salted request's keys are salted the same way.

    Args:
        index: the event-fed index (the ``kv_aware`` policy's own).
    """

    def __init__(self, index: KvIndex) -> None:
        self.index = index

    def matched_blocks(
        self, hashes: Sequence[int], workers: Sequence[str], salt: str | None = None
    ) -> dict[str, int]:
        """:meth:`KvIndex.matched_blocks` of ``hashes`` (salted when ``salt`` is given)."""
        if salt is not None and hashes:
            hashes = _SaltedKeys(hashes, salt)
        return self.index.matched_blocks(hashes, workers)


class KvEventFeed:
    """Applies the simulated engines' KV cache events to ``index``.

    Args:
        index: the index to feed (the ``kv_aware`` policy's).
        block_size: the replicas' KV block size (tokens; the events' ``block_size``).
        content_block_tokens: the router's content block size (tokens).

    Raises:
        ConfigError: if ``content_block_tokens`` does not divide ``block_size`` (the request's
            keys would then not be the replicas' block keys).
    """

    def __init__(self, index: KvIndex, block_size: int, content_block_tokens: int) -> None:
        if block_size % content_block_tokens:
            raise ConfigError(
                f"kv_aware in the simulator needs router.content_block_tokens "
                f"({content_block_tokens}) to divide the replicas' block_size ({block_size})"
            )
        self.index = index
        self.block_size = block_size
        self.events = 0

    def watch(self, replicas: Sequence[SimReplica]) -> None:
        """Listen to each replica's engine now and to every later engine of it (restarts;
        replicas the simulation adds later inherit the hook)."""
        for rep in replicas:
            rep.on_engine = self.engine_changed
            self.engine_changed(rep, rep.engine is not None)

    def engine_changed(self, rep: SimReplica, up: bool) -> None:
        """A replica's engine started (empty cache: listen to it) or was lost (its cache with
        it: ``AllBlocksCleared``)."""
        url = rep.url
        self.index.apply_events(url, (AllBlocksCleared(),))
        self.events += 1
        engine = rep.engine
        if up and engine is not None:
            index = self.index
            bs = self.block_size

            def listener(stored: bool, keys: list[int], salt: str | None) -> None:
                ids = tuple(keys) if salt is None else tuple(salted_keys(keys, salt))
                event = BlockStored(ids, None, (), bs, None, "GPU") if stored else None
                index.apply_events(url, (event or BlockRemoved(ids, "GPU"),))
                self.events += 1

            engine.set_kv_listener(listener)
