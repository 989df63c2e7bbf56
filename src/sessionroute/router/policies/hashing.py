"""Hash functions shared with vllm-router so placements match it bit for bit.

``fbi_hash`` is mcrouter's "furc" consistent hash composed with MurmurHash64A, as used by
vllm-router 0.1.x for ``consistent_hash`` rings and ``sticky_least_loaded`` rendezvous
tie-breaks. Sources: facebook/mcrouter ``lib/fbi/hash.c`` (``furc_hash``, ``murmur_rehash_64A``),
Austin Appleby's MurmurHash64A, and vllm-router's ``consistent_hash`` policy; the algorithm is
restated in ``shared/ROUTER.md``.
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = [
    "FURC_MAX",
    "FURC_SEED",
    "fbi_hash",
    "furc",
    "murmur64a",
    "rendezvous_score",
]

_MASK: Final = 0xFFFFFFFFFFFFFFFF
_M: Final = 0xC6A4A7935BD1E995
_R: Final = 47
FURC_SEED: Final = 4193360111
"""Seed of every MurmurHash64A call in mcrouter's furc hash."""
FURC_MAX: Final = (1 << 23) - 1
"""The ``m`` argument vllm-router passes to ``furc_hash``: 2**23 - 1 buckets."""
_FURC_SHIFT: Final = 23
_MAX_TRIES: Final = 32

# The C code's unsigned 64-bit arithmetic, on Python ints: every product is masked back to 64
# bits (``& _MASK``); shifts and xors of values below 2**64 stay below it.
_H8: Final = (FURC_SEED ^ ((8 * _M) & _MASK)) & _MASK  # murmur64a's state after 8 bytes' length
_H4: Final = (FURC_SEED ^ ((4 * _M) & _MASK)) & _MASK  # murmur64a's state after 4 bytes' length
_iter_u64 = struct.Struct("<Q").iter_unpack


def murmur64a(data: bytes, seed: int = FURC_SEED) -> int:
    """MurmurHash64A of ``data`` (little-endian 8-byte blocks), a 64-bit unsigned int.

    Raises:
        ValueError: if ``seed`` is not in ``[0, 2**64)``.
    """
    if not 0 <= seed <= _MASK:
        raise ValueError(f"seed must be an unsigned 64-bit int, got {seed!r}")
    n = len(data)
    h = seed ^ ((n * _M) & _MASK)
    nb = n & ~7
    if nb:
        for (k,) in _iter_u64(data[:nb]):
            k = (k * _M) & _MASK
            k ^= k >> _R
            h = ((h ^ ((k * _M) & _MASK)) * _M) & _MASK
    if n & 7:
        h = ((h ^ int.from_bytes(data[nb:], "little")) * _M) & _MASK
    h ^= h >> _R
    h = (h * _M) & _MASK
    return h ^ (h >> _R)


def _rehash(k: int) -> int:
    """``murmur64a(le_u64(k))`` unrolled (mcrouter ``murmur_rehash_64A``)."""
    k = (k * _M) & _MASK
    k ^= k >> _R
    h = ((_H8 ^ ((k * _M) & _MASK)) * _M) & _MASK
    h ^= h >> _R
    h = (h * _M) & _MASK
    return h ^ (h >> _R)


def _furc_generic(data: bytes, m: int) -> int:
    """The literal furc loop (any ``m >= 2``); see :func:`furc`."""
    blocks = [murmur64a(data)]

    def bit(i: int) -> int:
        b = i >> 6
        while b >= len(blocks):
            blocks.append(_rehash(blocks[-1]))
        return (blocks[b] >> (i & 63)) & 1

    d = 0
    while (1 << d) < m:
        d += 1
    a = d
    for _ in range(_MAX_TRIES):
        while not bit(a):
            if d == 0:
                return 0
            d -= 1
            a = d
        a += _FURC_SHIFT
        num = 1
        for _ in range(d - 1):
            num = (num << 1) | bit(a)
            a += _FURC_SHIFT
        if num < m:
            return num
    return 0


def _furc_max(data: bytes) -> int:
    """``furc(data, FURC_MAX)`` with the first try unrolled (the later tries are 2**-22 rare).

    The first try's descent stops at the highest set bit ``d`` of block 0's low 24 bits; the
    number is then 1 followed by the bits at ``d + 23*j`` for ``j = 1 .. d-1``.
    """
    b = murmur64a(data)
    d = (b & 0xFFFFFF).bit_length() - 1
    if d < 0:
        return 0
    if d <= 1:
        return 1
    # bit a of the stream is bit (a & 63) of block a >> 6; blocks are rehashed as needed (one
    # 64-bit int each, not one 576-bit int: shifting that allocated a big int per bit read)
    blocks = [b]
    blk = b
    num = 1
    a = d
    for _ in range(d - 1):
        a += _FURC_SHIFT
        i = a >> 6
        while i >= len(blocks):
            blk = _rehash(blk)
            blocks.append(blk)
        num = (num << 1) | ((blocks[i] >> (a & 63)) & 1)
    if num < FURC_MAX:
        return num
    return _furc_generic(data, FURC_MAX)


def furc(key: bytes | str, m: int = FURC_MAX) -> int:
    """mcrouter's ``furc_hash``: map ``key`` to a bucket in ``[0, m)``.

    Args:
        key: bytes, or a str encoded as UTF-8.
        m: number of buckets, ``1 <= m <= 2**23 - 1`` typically.

    Raises:
        ValueError: if ``m < 1``.
    """
    if m < 1:
        raise ValueError(f"furc needs m >= 1, got {m}")
    if m == 1:
        return 0
    data = key.encode() if isinstance(key, str) else key
    if m == FURC_MAX:
        return _furc_max(data)
    return _furc_generic(data, m)


def fbi_hash(key: str | bytes) -> int:
    """vllm-router's ``fbi_hash``: ``murmur64a(le_u32(furc(key)))``, a 64-bit unsigned int.

    Test vectors (``shared/ROUTER.md``): ``fbi_hash("") == 0xc0663e029346e424``,
    ``fbi_hash("abc") == 0xca00380dc6cd9f55``.
    """
    bucket = _furc_max(key.encode() if isinstance(key, str) else key)
    h = ((_H4 ^ bucket) * _M) & _MASK  # murmur64a of the bucket's 4 little-endian bytes
    h ^= h >> _R
    h = (h * _M) & _MASK
    return h ^ (h >> _R)


def rendezvous_score(session_id: str, worker: str) -> int:
    """Rendezvous (highest-random-weight) score of (session, worker): ``fbi_hash("sid:url")``."""
    return fbi_hash(f"{session_id}:{worker}")
