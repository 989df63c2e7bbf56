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

import math
from collections.abc import Sequence
from typing import Final

from sessionroute.keys import ROOT_KEY, BlockChain, chain_key

__all__ = [
    "ROOT_KEY",
    "SHARED_NAMESPACE",
    "BlockChain",
    "expand_trace_blocks",
    "reply_in_history",
    "reused_reply_tokens",
]

SHARED_NAMESPACE: Final = -1
"""Parent of the keys of a trace's globally shared leading blocks (see
:func:`expand_trace_blocks`)."""


def reused_reply_tokens(reply_reuse: float, output_len: int) -> int:
    """Tokens of a reply of ``output_len`` tokens that the next prompt repeats token for token:
    ``floor(reply_reuse * output_len)`` (a 1e-9 tolerance keeps ``0.7 * 10`` at 7).

    Raises:
        ValueError: for ``reply_reuse`` outside ``[0, 1]`` or a negative ``output_len``.
    """
    if not 0.0 <= reply_reuse <= 1.0:
        raise ValueError(f"reply_reuse must be in [0, 1], got {reply_reuse!r}")
    if output_len < 0:
        raise ValueError(f"output_len must be >= 0, got {output_len!r}")
    return min(output_len, math.floor(reply_reuse * output_len + 1e-9))


def reply_in_history(
    before_reply: BlockChain, reply_segment: int, output_len: int, reused: int, fresh_segment: int
) -> BlockChain:
    """The conversation as the next prompt holds it when only part of the previous reply
    is re-sent token for token (``reply_reuse`` of the swe-rl and toy workloads).

    The reply was generated as segment ``reply_segment`` of ``output_len`` tokens after the
    content of ``before_reply``; the next prompt repeats its first ``reused`` tokens and then
    ``output_len - reused`` *other* tokens (``fresh_segment``): what a chat template that
    re-renders history (drops reasoning, normalises whitespace) or a detokenise / re-tokenise
    round trip does. Lengths are unchanged; the keys of blocks that lie wholly inside the
    repeated part equal the generated reply's (a segment's block keys depend on its start
    and offsets, not its length, :mod:`sessionroute.keys`), and every later block's key
    differs, so the re-rendered part misses every prefix cache.

    Args:
        before_reply: the chain of the prompt the reply answered; it becomes the result
            (extended in place).
        reply_segment: the reply's segment id (as appended for the generating turn).
        output_len: the reply's tokens.
        reused: tokens re-sent unchanged (``0 <= reused <= output_len``).
        fresh_segment: a new segment id for the re-rendered rest.

    Returns:
        ``before_reply``, extended by ``output_len`` tokens.

    Raises:
        ValueError: for ``reused`` outside ``[0, output_len]``.
    """
    if not 0 <= reused <= output_len:
        raise ValueError(f"reused must be in [0, {output_len}], got {reused!r}")
    before_reply.append(reply_segment, reused)
    before_reply.append(fresh_segment, output_len - reused)
    return before_reply


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
