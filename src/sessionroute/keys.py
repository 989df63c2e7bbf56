"""Content keys: one explicit 64-bit mix for chained KV block keys.

A simulated or replayed prompt is identified by the chained keys of its full KV blocks (like
vLLM's block hashes, ``vllm/v1/core/kv_cache_utils.py``: a block's hash covers its parent's hash
and its own content). Every such key in sessionroute is :func:`chain_key` of a parent key and a
few integers describing the block's content (a segment id, an offset, a trace block id, ...):

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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

__all__ = ["GAMMA", "MASK64", "ROOT_KEY", "chain_key", "chain_keys", "mix64"]

MASK64: Final = (1 << 64) - 1
"""The low 64 bits."""
GAMMA: Final = 0x9E3779B97F4A7C15
"""splitmix64's increment: 2**64 / golden ratio, rounded to odd (Steele, Lea, Flood 2014)."""
ROOT_KEY: Final = 0
"""Parent key of a sequence's first block."""

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


def chain_keys(parent: int, items: Iterable[int]) -> list[int]:
    """``[chain_key(parent, x) for x in items]`` in one call: the keys of several contents
    that each follow ``parent`` (a run of full blocks of one segment, keyed by their offsets).

    Args:
        parent: the key the contents follow.
        items: one integer per content.

    Returns:
        One int in ``[0, 2**64)`` per item, in order.
    """
    p = parent & MASK64
    out = []
    for x in items:
        z = ((p ^ x) + GAMMA) & MASK64
        z = ((z ^ (z >> 30)) * _M1) & MASK64
        z = ((z ^ (z >> 27)) * _M2) & MASK64
        out.append(z ^ (z >> 31))
    return out
