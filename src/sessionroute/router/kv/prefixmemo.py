"""Incremental vLLM block hashing: hash only the blocks no earlier prompt had.

Hashing a 32k-token prompt into vLLM's sha256 block hashes from scratch takes milliseconds in
Python (``sessionroute bench policies --prompt-tokens 32768``, ``vllm_hash_ms``). Agent
conversations resend their history: turn ``k + 1``'s prompt is turn ``k``'s prompt plus the reply
and the new observation, so all but the last few hundred tokens were hashed before. vLLM's
chain (block ``i`` hashes block ``i - 1``'s hash with block ``i``'s tokens) means a block's hash
depends only on the tokens up to its end, so a memo of token prefixes and their hash chains
gives every block of the common prefix without hashing, and the new blocks are hashed from the
memo's last hash (:mod:`sessionroute.router.kv.hashing`).

The memo is a radix tree over whole blocks, per ``cache_salt``: each node holds the token bytes
of a run of blocks (4-byte ids, native order: ``array("I")``), their raw hashes and int hashes,
and its children keyed by the bytes of their first block. A lookup walks from the root: one
dict probe on the next block's bytes and one ``bytes.startswith`` (a ``memcmp``) per node on
the path, so its cost grows with the number of places where prompts diverge on the path
(a shared system prompt, a task shared by a group, one branch per conversation), not with the
prompt's length, apart from the ``memcmp`` and copying the ints. A conversation's next turn
extends its leaf in place, so a session's path stays a few nodes long. No session id is needed:
the content alone finds the prefix, as it must for clients that send none.

Memory is bounded by ``max_blocks`` (blocks over all nodes): past it, the least recently used
leaves are dropped (a dropped prefix is hashed again when it comes back; results never change).
"""

from __future__ import annotations

import hashlib
import pickle
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from sessionroute.errors import ConfigError
from sessionroute.router.kv.hashing import hash_function, none_hash

__all__ = ["PrefixMemo", "pack_token_ids"]

_ITEM = array("I").itemsize


def pack_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as the memo's bytes (``array("I")``: 4 bytes per id, native order).

    Raises:
        OverflowError: an id outside ``[0, 2**32)`` (no tokenizer has such ids).
    """
    return array("I", token_ids).tobytes()


class _Node:
    __slots__ = ("children", "digests", "edge", "ints", "key", "parent")

    def __init__(
        self,
        parent: _Node | None,
        key: bytes,
        edge: bytearray,
        digests: list[bytes],
        ints: list[int],
    ) -> None:
        self.parent = parent
        self.key = key  # the bytes of this node's first block (its key in parent.children)
        self.edge = edge  # token bytes of this node's blocks (grows in place: a conversation)
        self.digests = digests  # raw hash of each block
        self.ints = ints  # the events' int form of each hash
        self.children: dict[bytes, _Node] = {}


class PrefixMemo:
    """vLLM block hashes of token-id prompts, hashing only blocks not memoized.

    Args:
        block_size: the servers' ``--block-size`` (tokens).
        algo: the servers' ``--prefix-caching-hash-algo`` (default ``sha256``).
        seed: the servers' ``PYTHONHASHSEED``, if set.
        max_blocks: bound of the memo (blocks over all prompts; default 2**20, about 100 MB).

    Attributes:
        hashed: blocks hashed so far (memo misses).
        reused: blocks taken from the memo so far.

    Raises:
        ConfigError: bad ``block_size`` or ``max_blocks``, unknown ``algo``, an xxhash algo
            without ``seed`` (:func:`~sessionroute.router.kv.hashing.none_hash`).
    """

    def __init__(
        self,
        block_size: int,
        algo: str = "sha256",
        seed: str | None = None,
        max_blocks: int = 1 << 20,
    ) -> None:
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        if max_blocks < 1:
            raise ConfigError(f"max_blocks must be >= 1, got {max_blocks}")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self._fn: Callable[[Any], bytes] = hash_function(algo)
        self._algo = algo
        self._root_hash = none_hash(algo, seed)
        self._bb = block_size * _ITEM
        self._roots: dict[str | None, _Node] = {}
        self._leaves: OrderedDict[int, _Node] = OrderedDict()  # id(node) -> node, LRU first
        self._size = 0
        self.hashed = 0
        self.reused = 0

    @property
    def size(self) -> int:
        """Blocks memoized now (<= ``max_blocks`` after each call)."""
        return self._size

    def hashes(self, tokens: bytes, cache_salt: str | None = None) -> list[int]:
        """vLLM's block hashes of the full blocks of ``tokens`` (:func:`pack_token_ids`), in
        the events' int form -- equal to
        :func:`~sessionroute.router.kv.hashing.block_hashes` of the ids; the prompt is
        memoized.

        Args:
            tokens: the prompt's token ids, packed.
            cache_salt: the request's ``cache_salt`` (a separate tree: it changes every hash).
        """
        bb = self._bb
        nfull = len(tokens) // bb
        root = self._roots.get(cache_salt)
        if root is None:
            root = self._roots[cache_salt] = _Node(None, b"", bytearray(), [], [])
        out: list[int] = []
        node = root
        pos = 0
        end = nfull * bb
        parent = self._root_hash
        split_at = 0  # blocks of `child` matched when the walk stops inside an edge
        child: _Node | None = None
        while pos < end:
            child = node.children.get(tokens[pos : pos + bb])
            if child is None:
                break
            edge = child.edge
            if tokens.startswith(edge, pos):
                out += child.ints
                pos += len(edge)
                parent = child.digests[-1]
                node = child
                child = None
                continue
            # the prompt leaves this edge inside it: the longest common run of whole blocks
            lo, hi = 1, min(len(edge), end - pos) // bb  # block 1 matched (its key)
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if tokens.startswith(edge[: mid * bb], pos):
                    lo = mid
                else:
                    hi = mid - 1
            split_at = lo
            out += child.ints[:lo]
            pos += lo * bb
            parent = child.digests[lo - 1]
            break
        self.reused += len(out)
        if child is not None:  # stopped inside child's edge
            if pos == end:
                self._touch(child)
                return out
            node = self._split(child, split_at)
        self._touch(node)
        if pos < end:
            self._grow(node, tokens, pos, end, parent, cache_salt if pos == 0 else None, out)
        return out

    # -- tree upkeep ----------------------------------------------------------------------
    def _grow(
        self,
        node: _Node,
        tokens: bytes,
        pos: int,
        end: int,
        parent: bytes,
        salt: str | None,
        out: list[int],
    ) -> None:
        """Hash blocks ``pos .. end`` (bytes) from ``parent`` and memoize them under ``node``."""
        bb = self._bb
        fn = self._fn
        view = memoryview(tokens).cast("I")
        bs = self.block_size
        extra: tuple[Any, ...] | None = (("cache_salt", salt),) if salt else None
        digests: list[bytes] = []
        ints: list[int] = []
        first = pos // _ITEM
        if extra is not None:  # the salted first block, then plain ones
            parent = fn((parent, tuple(view[first : first + bs]), extra))
            digests.append(parent)
            ints.append(int.from_bytes(parent[-8:], "big"))
            first += bs
        stop = end // _ITEM
        if self._algo == "sha256":  # vLLM's default, inlined (the per-block cost of a turn)
            sha = hashlib.sha256
            dumps = pickle.dumps
            proto = pickle.HIGHEST_PROTOCOL
            from_bytes = int.from_bytes
            add_digest = digests.append
            add_int = ints.append
            for start in range(first, stop, bs):
                parent = sha(dumps((parent, tuple(view[start : start + bs]), None), proto)).digest()
                add_digest(parent)
                add_int(from_bytes(parent[24:], "big"))
        else:
            for start in range(first, stop, bs):
                parent = fn((parent, tuple(view[start : start + bs]), None))
                digests.append(parent)
                ints.append(int.from_bytes(parent[-8:], "big"))
        view.release()
        self.hashed += len(ints)
        out += ints
        edge = bytearray(tokens[pos:end])
        if node.parent is not None and not node.children:  # a leaf: the conversation goes on
            node.edge += edge  # in place, amortized: no copy of the conversation so far
            node.digests += digests
            node.ints += ints
        else:
            leaf = _Node(node, bytes(edge[:bb]), edge, digests, ints)
            node.children[leaf.key] = leaf
            self._leaves.pop(id(node), None)
            self._leaves[id(leaf)] = leaf
        self._size += len(ints)
        if self._size > self.max_blocks:
            self._shrink()

    def _split(self, child: _Node, m: int) -> _Node:
        """Cut ``child`` after its first ``m`` blocks; return the upper part (the new node)."""
        bb = self._bb
        parent = child.parent
        if parent is None:  # pragma: no cover - the root is never a child
            raise RuntimeError("split of the root")
        upper = _Node(parent, child.key, child.edge[: m * bb], child.digests[:m], child.ints[:m])
        parent.children[child.key] = upper
        del child.edge[: m * bb]
        child.digests = child.digests[m:]
        child.ints = child.ints[m:]
        child.key = bytes(child.edge[:bb])
        child.parent = upper
        upper.children[child.key] = child
        return upper

    def _touch(self, node: _Node) -> None:
        if id(node) in self._leaves:
            self._leaves.move_to_end(id(node))

    def _shrink(self) -> None:
        """Drop least recently used leaves until the memo is within ``max_blocks``."""
        leaves = self._leaves
        while self._size > self.max_blocks and leaves:
            _, leaf = leaves.popitem(last=False)
            parent = leaf.parent
            if parent is None:  # pragma: no cover - roots are not leaves
                continue
            del parent.children[leaf.key]
            self._size -= len(leaf.ints)
            if not parent.children and parent.parent is not None:
                leaves[id(parent)] = parent
                leaves.move_to_end(id(parent), last=False)
