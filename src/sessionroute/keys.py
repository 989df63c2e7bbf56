"""Content keys: one explicit 64-bit mix for chained KV block keys.

A simulated or replayed prompt is identified by the chained keys of its full KV blocks (like
vLLM's block hashes, ``vllm/v1/core/kv_cache_utils.py``: a block's hash covers its parent's hash
and its own content). Every such key in sessionroute comes from :func:`chain_key` of a parent key
and a few integers describing the block's content (a segment id, an offset, a trace block id,
...), or is such a key plus a block's offset inside one segment (:func:`offset_keys`,
below):

    h = parent;  for each item x:  h = mix64((h ^ x) + GAMMA)     (all mod 2**64)

:func:`mix64` is the output function of splitmix64 (Guy L. Steele Jr., Doug Lea, Christine H.
Flood, "Fast Splittable Pseudorandom Number Generators", OOPSLA 2014; ``mix64`` of
``java.util.SplittableRandom`` and Sebastiano Vigna's ``splitmix64.c``), with David Stafford's
"Mix13" constants (shifts 30, 27, 31, multipliers ``0xBF58476D1CE4E5B9`` and
``0x94D049BB133111EB``; "Better Bit Mixing - Improving on MurmurHash3's 64-bit Finalizer",
2011). ``GAMMA`` is splitmix64's increment, ``0x9E3779B97F4A7C15`` (2**64 divided by the golden
ratio, odd); adding it keeps ``mix64(0) == 0`` from making zero a fixed point of the chain.
``mix64`` is a bijection of 64-bit values, so distinct inputs of one step never collide;
distinct contents collide with probability about 2**-64 per pair.

Keys are unsigned 64-bit ints in ``[0, 2**64)``. Items may be any ints (negative ones are taken
mod 2**64, as two's complement). The arithmetic is plain integer arithmetic on Python ints
masked to 64 bits: the same keys on every platform, process and Python version, compiled or
not (unlike ``hash(str)``, and unlike CPython's tuple hash, which is an implementation detail).

:class:`BlockChain` keys a conversation made of *segments* (a system prompt, a task statement,
each output and each tool observation), each named by an integer id and a length in tokens: it
turns a growing sequence of segments into the chained keys of its full blocks, like vLLM's block
hashes (``vllm/v1/core/kv_cache_utils.py``: a block's hash covers its parent's hash and its own
tokens). The key of block ``i`` stands for the content up to the end of block ``i``:

* Each non-empty append of a segment gives it a *segment key*, ``chain_key(follow,
  segment)``, and then moves ``follow`` on to ``chain_key(segment_key, ~length)``; ``follow``
  starts at :data:`ROOT_KEY`. So ``follow`` is the fold of every appended ``(segment,
  ~length)`` pair: one value per history. The fold alternates ids and lengths, so it reads only
  one way; the items are typed too (segment ids in ``[0, 2**63)``, lengths absorbed as their
  bitwise complement ``~x``, i.e. at or above 2**63 mod 2**64), so an id never equals a length.
* A block's key is the key of the segment its last token is in, plus the block's token
  offset in that segment (0 for a block that began in an earlier segment), mod 2**64
  (:func:`offset_keys`). A long segment's blocks need no mix of their own (most of a
  simulated prompt's blocks): appending a segment costs two mixes however long it is.
* No key with an offset added is ever the parent of a mix: the keys of one segment are
  consecutive and :func:`chain_key` combines a parent with xor, so ``chain_key(key + 16, a)
  == chain_key(key + 32, b)`` whenever ``a ^ b == (key + 16) ^ (key + 32)``, a small number,
  as segment ids are. Every parent is a mixed value: ``follow``, or a segment key (which is
  also the key of its offset-0 block, if one ends in the segment).

Two sequences get the same key at block ``i`` exactly when they hold the same segments up to
the end of block ``i``, so shared content (a system prompt, a GRPO group's task) hits; and a key
never appears at two positions. Distinct contents share a key only by accident: for mixed
keys about 2**-64 per pair; for two segments' keys when they differ by one of the ~4n
differences of their offsets, at most about ``4 * n / 2**64`` per pair of segments of ``n`` blocks
(``n <= 131,072`` for a 131,072-token context even in 1-token blocks: below 10**-13).

This module is compiled with the replica model (:mod:`sessionroute.native`): the same code,
the same keys, pure Python or compiled (``tests/test_keys.py``).
"""

from __future__ import annotations

from typing import Final

__all__ = ["GAMMA", "MASK64", "ROOT_KEY", "BlockChain", "chain_key", "mix64", "offset_keys"]

MASK64: Final = (1 << 64) - 1
"""The low 64 bits."""
GAMMA: Final = 0x9E3779B97F4A7C15
"""splitmix64's increment: 2**64 / golden ratio, rounded to odd (Steele, Lea, Flood 2014)."""
ROOT_KEY: Final = 0
"""Parent key of a sequence's first block."""
_SEGMENT_LIMIT: Final = 1 << 63  # segment ids below it; lengths are absorbed as ~x (above it)

_M1: Final = 0xBF58476D1CE4E5B9  # Stafford's Mix13, first multiplier
_M2: Final = 0x94D049BB133111EB  # Stafford's Mix13, second multiplier


def mix64(z: int) -> int:
    """splitmix64's finalizer (Stafford's Mix13) of ``z`` mod 2**64: a bijection of 64-bit
    values that spreads every input bit over every output bit.

    Returns:
        An int in ``[0, 2**64)``.
    """
    z &= MASK64
    z = ((z ^ (z >> 30)) * _M1) & MASK64
    z = ((z ^ (z >> 27)) * _M2) & MASK64
    return z ^ (z >> 31)


def chain_key(parent: int, *items: int) -> int:
    """The key of content ``items`` that follows the content keyed ``parent``.

    Each item is absorbed in turn: ``h = mix64((h ^ item) + GAMMA)``, starting from ``h =
    parent`` (see the module docstring). Order matters; ``chain_key(p)`` is ``p`` mod 2**64.

    Args:
        parent: the key of the preceding content (:data:`ROOT_KEY` for none), or a namespace.
        items: integers that identify the content (segment ids, offsets, trace block ids).

    Returns:
        An int in ``[0, 2**64)``.
    """
    h = parent & MASK64
    for x in items:
        # mix64((h ^ x) + GAMMA), written out: a call per item would cost a third of the time
        z = ((h ^ x) + GAMMA) & MASK64
        z = ((z ^ (z >> 30)) * _M1) & MASK64
        z = ((z ^ (z >> 27)) * _M2) & MASK64
        h = z ^ (z >> 31)
    return h


def offset_keys(base: int, start: int, stop: int, step: int) -> list[int]:
    """The keys of full blocks inside one segment: ``(base + o) mod 2**64`` for each block's
    token offset ``o`` in ``range(start, stop, step)``.

    ``base`` is the segment's key (``chain_key(follow, segment)``, already mixed), so a
    block's key still identifies what precedes the segment, the segment and the offset; the
    offsets need no mix of their own. The results are consecutive: never use one as a
    :func:`chain_key` parent (module docstring).

    Args:
        base: the segment's key, in ``[0, 2**64)``.
        start, stop, step: the blocks' token offsets in the segment, as for ``range``
            (``0 <= start``, ``step >= 1``).

    Returns:
        One int in ``[0, 2**64)`` per offset, in order.
    """
    if base + stop <= MASK64:
        return list(range(base + start, base + stop, step))
    return [(base + o) & MASK64 for o in range(start, stop, step)]


class BlockChain:
    """Chained keys of the full blocks of a growing segment sequence.

    Args:
        block_size: tokens per block (>= 1).

    Attributes:
        keys: keys of the full blocks so far (block ``i`` covers tokens
            ``[i * block_size, (i + 1) * block_size)``).
        tokens: total tokens appended.

    Raises:
        ValueError: on ``block_size < 1``.
    """

    __slots__ = ("_follow", "_last", "_tail_len", "block_size", "keys", "tokens")

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size!r}")
        self.block_size = block_size
        self.keys: list[int] = []
        self.tokens = 0
        # a chain_key value that stands for everything appended so far: the parent of the next
        # segment's key (module docstring)
        self._follow = ROOT_KEY
        self._tail_len = 0  # tokens in the open (partial) block
        self._last: int | None = None  # the segment of the last non-empty append

    def copy(self) -> BlockChain:
        """An independent chain with the same content (to branch a shared prefix)."""
        c = BlockChain(self.block_size)
        c.keys = self.keys.copy()
        c.tokens = self.tokens
        c._follow = self._follow
        c._tail_len = self._tail_len
        c._last = self._last
        return c

    def append(self, segment: int, length: int) -> None:
        """Append ``length`` tokens of segment ``segment`` (an int unique to that content, all
        of whose tokens are appended in this one call).

        Raises:
            ValueError: on a negative ``length``, a ``segment`` outside ``[0, 2**63)``, or
                the segment of the previous non-empty append (all of a segment's tokens come in
                one call: a continuation sent as a second append would get keys that differ
                from the same content appended once).
        """
        if length <= 0:
            if length < 0:
                raise ValueError(f"segment length must be >= 0, got {length!r}")
            return
        if not 0 <= segment < _SEGMENT_LIMIT:
            raise ValueError(f"segment ids must be in [0, 2**63), got {segment!r}")
        if segment == self._last:
            raise ValueError(f"segment {segment!r} appended twice in a row: use a new id")
        self._last = segment
        seg_key = chain_key(self._follow, segment)
        self._follow = chain_key(seg_key, ~length)
        self.tokens += length
        bs = self.block_size
        off = 0
        if self._tail_len:  # a block is open: this segment's first tokens go into it
            need = bs - self._tail_len
            if length < need:
                self._tail_len += length
                return
            self.keys.append(seg_key)  # the block across segments
            off = need
        # the full blocks inside the segment: its key plus each block's offset in it
        end = length - (length - off) % bs
        if off < end:
            self.keys += offset_keys(seg_key, off, end, bs)
        self._tail_len = length - end
