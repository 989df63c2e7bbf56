"""Content identity of simulated conversations: chained KV block keys.

A conversation is a sequence of *segments* (a system prompt, a task statement, each output and
each tool observation), each named by an integer id and a length in tokens;
:class:`~sessionroute.keys.BlockChain` (re-exported here) turns it into the chained keys of its
full blocks (the scheme: :mod:`sessionroute.keys`). Trace replays key their prompts with
:func:`expand_trace_blocks`.

Keys come from :func:`sessionroute.keys.chain_key`, an explicit 64-bit mix (splitmix64's
finalizer; the blocks inside one segment are the segment's key plus an offset), the same on
every platform and Python version, so accidental collisions are negligible at simulator scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from sessionroute.keys import ROOT_KEY, BlockChain, chain_key

__all__ = ["ROOT_KEY", "SHARED_NAMESPACE", "BlockChain", "expand_trace_blocks"]

SHARED_NAMESPACE: Final = -1
"""Parent of the keys of a trace's globally shared leading blocks (see
:func:`expand_trace_blocks`)."""


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
