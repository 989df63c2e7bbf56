"""Content identity of simulated conversations: chained KV block keys.

A conversation is a sequence of *segments* (a system prompt, a task statement, each output and
each tool observation), each named by an integer id and a length in tokens. :class:`BlockChain`
turns a growing sequence of segments into the chained keys of its full blocks, like vLLM's block
hashes (``vllm/v1/core/kv_cache_utils.py``: a block's hash covers its parent's hash and its own
tokens): the key of block ``i`` is a hash of the key of block ``i - 1`` and the segment pieces
that fill block ``i``. A block across segments absorbs each piece's segment and the length of
every piece but the last: the first piece's offset follows from the parent key (a segment's
tokens are appended in one call, so a block that starts inside a segment continues the
previous block's piece of it, and one that starts a segment starts it at offset 0), later
pieces start their segments at offset 0, and the last piece's length is what the block size
leaves. A run of full blocks inside one segment is keyed by the key before the run, the
segment and the offset, which identifies the same content without a sequential loop. Two
sequences get the same key at block ``i`` exactly when they hold the same segments up to the
end of block ``i``, so shared content (a system prompt, a GRPO group's task) hits and distinct
content never does.

Keys are :func:`sessionroute.keys.chain_key` values: an explicit 64-bit mix (splitmix64's
finalizer), the same on every platform and Python version, so accidental collisions are
negligible at simulator scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from sessionroute.keys import ROOT_KEY, chain_key, chain_keys

__all__ = ["ROOT_KEY", "SHARED_NAMESPACE", "BlockChain", "expand_trace_blocks"]

SHARED_NAMESPACE: Final = -1
"""Parent of the keys of a trace's globally shared leading blocks (see
:func:`expand_trace_blocks`)."""


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

    __slots__ = ("_last", "_tail", "_tail_len", "block_size", "keys", "tokens")

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size!r}")
        self.block_size = block_size
        self.keys: list[int] = []
        self.tokens = 0
        # the partial block: segment and length of each piece but the last one's length
        # (which the next key leaves out), and its tokens
        self._tail: list[int] = []
        self._tail_len = 0
        self._last: int | None = None  # the segment of the last non-empty append

    def copy(self) -> BlockChain:
        """An independent chain with the same content (to branch a shared prefix)."""
        c = BlockChain(self.block_size)
        c.keys = self.keys.copy()
        c.tokens = self.tokens
        c._tail = self._tail.copy()
        c._tail_len = self._tail_len
        c._last = self._last
        return c

    def append(self, segment: int, length: int) -> None:
        """Append ``length`` tokens of segment ``segment`` (an int unique to that content, all
        of whose tokens are appended in this one call).

        Raises:
            ValueError: on a negative ``length``, or on the segment of the previous non-empty
                append (its tokens would not be told apart from a continuation of it).
        """
        if length <= 0:
            if length < 0:
                raise ValueError(f"segment length must be >= 0, got {length!r}")
            return
        if segment == self._last:
            raise ValueError(f"segment {segment!r} appended twice in a row: use a new id")
        self._last = segment
        bs = self.block_size
        keys = self.keys
        self.tokens += length
        off = 0
        if self._tail_len:
            need = bs - self._tail_len
            if length < need:
                self._tail += [segment, length]
                self._tail_len += length
                return
            # the block across segments: its parent key, each earlier piece's segment and
            # length, and this segment (its length is the rest of the block)
            keys.append(chain_key(keys[-1] if keys else ROOT_KEY, *self._tail, segment))
            self._tail = []
            self._tail_len = 0
            off = need
        # Full blocks inside one segment: keyed by the key before them (the anchor), the
        # segment and the offset - the same content up to the block's end, as a chain. Each is
        # chain_key(anchor, segment, o), computed as chain_key(chain_key(anchor, segment), o),
        # the whole run in one call.
        end = length - (length - off) % bs
        if off < end:
            run = chain_key(keys[-1] if keys else ROOT_KEY, segment)
            keys += chain_keys(run, range(off, end, bs))
        if end < length:
            self._tail = [segment, length - end]
            self._tail_len = length - end


def expand_trace_blocks(
    ids: Sequence[int],
    src_block: int,
    n_tokens: int,
    block_size: int,
    namespace: int,
    shared_prefix_tokens: int = 0,
) -> list[int]:
    """Keys at ``block_size`` for a prompt described by a trace's chained block ids.

    Trace block ``j`` (id ``ids[j]``) covers tokens ``[j * src_block, (j + 1) * src_block)``.
    The ids are chained again here, ``c[j] = chain_key(c[j - 1], ids[j])`` from ``c[-1] =
    namespace``, so a key identifies all content up to its end even where a trace's ids are not
    prefix-chained themselves (the replica model relies on chained keys, ENGINE.md; vLLM chains
    its block hashes the same way); for chained ids such as Mooncake's ``hash_ids`` this changes
    no sharing. Block ``i`` at ``block_size`` ends at token ``e = (i + 1) * block_size``; its key
    is ``chain_key(c[(e - 1) // src_block], e)``. Keys are made for every full block with ``e <=
    n_tokens`` whose trace block exists. Blocks ending within the first ``shared_prefix_tokens``
    tokens get a namespace-free key, ``chain_key(SHARED_NAMESPACE, e)`` (content shared by every
    session, e.g. a system prompt the trace does not hash globally).

    Args:
        ids: chained trace block ids (Mooncake ``hash_ids``, Weka rebuilt ids).
        src_block: tokens per trace block (Mooncake 512, Weka 64).
        n_tokens: prompt length in tokens.
        block_size: the replica's block size in tokens.
        namespace: separates id spaces (Weka ids are local to a session).
        shared_prefix_tokens: globally shared leading tokens (0 for none).

    Returns:
        ``min(n_tokens // block_size, ...)`` keys, a list of ints.
    """
    n = n_tokens // block_size
    covered = len(ids) * src_block
    if n * block_size > covered:
        n = covered // block_size
    chained: list[int] = []
    c = namespace
    for x in ids[: ((n * block_size - 1) // src_block + 1) if n else 0]:
        c = chain_key(c, x)
        chained.append(c)
    out: list[int] = []
    for i in range(n):
        e = (i + 1) * block_size
        if e <= shared_prefix_tokens:
            out.append(chain_key(SHARED_NAMESPACE, e))
        else:
            out.append(chain_key(chained[(e - 1) // src_block], e))
    return out
