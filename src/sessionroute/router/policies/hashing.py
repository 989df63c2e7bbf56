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

from mypy_extensions import i64

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

# The 64-bit arithmetic runs on signed 64-bit values (``i64``): compiled by mypyc it is native
# wrapping machine arithmetic, ~10x faster than Python's big ints; as plain Python, _s64 folds
# each product back into the signed range. Unsigned right shifts are ``(x >> r) & low bits``.


def _signed(u: int) -> i64:
    """An unsigned 64-bit value as the signed value with the same bits."""
    return i64(u - (1 << 64) if u >> 63 else u)


_MS: Final[i64] = _signed(_M)
_R_LOW: Final[i64] = (1 << (64 - _R)) - 1  # the bits an unsigned ``x >> 47`` keeps
_H8S: Final[i64] = _signed((FURC_SEED ^ ((8 * _M) & _MASK)) & _MASK)  # murmur64a's state, 8 B
_H4S: Final[i64] = _signed((FURC_SEED ^ ((4 * _M) & _MASK)) & _MASK)  # murmur64a's state, 4 B
_iter_i64 = struct.Struct("<q").iter_unpack


def _s64(x: i64) -> i64:
    """``x`` reduced to a signed 64-bit value (two's complement), the result of a wrapping
    product; a no-op where ``i64`` arithmetic already wraps (compiled)."""
    if -2 <= (x >> 62) <= 1:  # in [-2**63, 2**63); no 64-bit literal (mypyc boxes those)
        return x
    return i64(((int(x) + (1 << 63)) & _MASK) - (1 << 63))


def _murmur_s(data: bytes, seed: int) -> i64:
    """MurmurHash64A of ``data`` as a signed 64-bit value (see :func:`murmur64a`)."""
    n = len(data)
    h = _signed((seed ^ ((n * _M) & _MASK)) & _MASK)
    nb = n & ~7
    if nb:
        for (block,) in _iter_i64(data[:nb]):
            k = _s64(i64(block) * _MS)
            k ^= (k >> _R) & _R_LOW
            h = _s64((h ^ _s64(k * _MS)) * _MS)
    if n & 7:
        h = _s64((h ^ i64(int.from_bytes(data[nb:], "little"))) * _MS)
    h ^= (h >> _R) & _R_LOW
    h = _s64(h * _MS)
    return h ^ ((h >> _R) & _R_LOW)


def murmur64a(data: bytes, seed: int = FURC_SEED) -> int:
    """MurmurHash64A of ``data`` (little-endian 8-byte blocks), a 64-bit unsigned int.

    Raises:
        ValueError: if ``seed`` is not in ``[0, 2**64)``.
    """
    if not 0 <= seed <= _MASK:
        raise ValueError(f"seed must be an unsigned 64-bit int, got {seed!r}")
    return int(_murmur_s(data, seed)) & _MASK


def _rehash(k: i64) -> i64:
    """``murmur64a(le_u64(k))`` unrolled (mcrouter ``murmur_rehash_64A``), signed values."""
    k = _s64(k * _MS)
    k ^= (k >> _R) & _R_LOW
    h = _s64((_H8S ^ _s64(k * _MS)) * _MS)
    h ^= (h >> _R) & _R_LOW
    h = _s64(h * _MS)
    return h ^ ((h >> _R) & _R_LOW)


def _furc_generic(data: bytes, m: int) -> int:
    """The literal furc loop (any ``m >= 2``); see :func:`furc`."""
    blocks = [_murmur_s(data, FURC_SEED)]

    def bit(i: int) -> int:
        b = i >> 6
        while b >= len(blocks):
            blocks.append(_rehash(blocks[-1]))
        return int((blocks[b] >> (i & 63)) & 1)

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
    b = _murmur_s(data, FURC_SEED)
    d = int(b & 0xFFFFFF).bit_length() - 1
    if d < 0:
        return 0
    if d <= 1:
        return 1
    # bit a of the stream is bit (a & 63) of block a >> 6; blocks are rehashed as needed (one
    # 64-bit int each, not one 576-bit int: shifting that allocated a big int per bit read)
    blocks: list[i64] = [b]
    blk = b
    num = 1
    a = d
    for _ in range(d - 1):
        a += _FURC_SHIFT
        i = a >> 6
        while i >= len(blocks):
            blk = _rehash(blk)
            blocks.append(blk)
        num = (num << 1) | int((blocks[i] >> (a & 63)) & 1)
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
    h = _s64((_H4S ^ i64(_furc_max(key.encode() if isinstance(key, str) else key))) * _MS)
    h ^= (h >> _R) & _R_LOW
    h = _s64(h * _MS)
    return int(h ^ ((h >> _R) & _R_LOW)) & _MASK


def rendezvous_score(session_id: str, worker: str) -> int:
    """Rendezvous (highest-random-weight) score of (session, worker): ``fbi_hash("sid:url")``."""
    return fbi_hash(f"{session_id}:{worker}")
