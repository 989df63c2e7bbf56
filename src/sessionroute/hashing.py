"""Hash functions shared with vllm-router so placements match it bit for bit.

``fbi_hash`` is mcrouter's "furc" consistent hash composed with MurmurHash64A, as used by
vllm-router 0.1.x for ``consistent_hash`` rings and ``sticky_least_loaded`` rendezvous
tie-breaks. Sources: facebook/mcrouter ``lib/fbi/hash.c`` (``furc_hash``, ``murmur_rehash_64A``),
Austin Appleby's MurmurHash64A, and vllm-router's ``consistent_hash`` policy; the algorithm is
restated in ``shared/ROUTER.md``.
"""

from __future__ import annotations

import struct

__all__ = ["FURC_MAX", "FURC_SEED", "fbi_hash", "furc", "murmur64a", "rendezvous_score"]

_MASK = 0xFFFFFFFFFFFFFFFF
_M = 0xC6A4A7935BD1E995
_R = 47
FURC_SEED = 4193360111
"""Seed of every MurmurHash64A call in mcrouter's furc hash."""
FURC_MAX = (1 << 23) - 1
"""The ``m`` argument vllm-router passes to ``furc_hash``: 2**23 - 1 buckets."""
_FURC_SHIFT = 23
_MAX_TRIES = 32
_U64 = struct.Struct("<Q")


def murmur64a(data: bytes, seed: int = FURC_SEED) -> int:
    """MurmurHash64A of ``data`` (little-endian 8-byte blocks), a 64-bit unsigned int."""
    n = len(data)
    h = (seed ^ ((n * _M) & _MASK)) & _MASK
    nblocks = n // 8
    if nblocks:
        for (k,) in struct.iter_unpack("<Q", data[: nblocks * 8]):
            k = (k * _M) & _MASK
            k ^= k >> _R
            k = (k * _M) & _MASK
            h ^= k
            h = (h * _M) & _MASK
    tail = data[nblocks * 8 :]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * _M) & _MASK
    h ^= h >> _R
    h = (h * _M) & _MASK
    h ^= h >> _R
    return h


def _rehash(k: int) -> int:
    return murmur64a(_U64.pack(k))


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


def fbi_hash(key: str | bytes) -> int:
    """vllm-router's ``fbi_hash``: ``murmur64a(le_u32(furc(key)))``, a 64-bit unsigned int.

    Test vectors (``shared/ROUTER.md``): ``fbi_hash("") == 0xc0663e029346e424``,
    ``fbi_hash("abc") == 0xca00380dc6cd9f55``.
    """
    return murmur64a(struct.pack("<I", furc(key)))


def rendezvous_score(session_id: str, worker: str) -> int:
    """Rendezvous (highest-random-weight) score of (session, worker): ``fbi_hash("sid:url")``."""
    return fbi_hash(f"{session_id}:{worker}")
