"""Rendezvous (highest-random-weight) choice over many workers, bit-exact with vllm-router.

``sticky_least_loaded`` places a new session on the tied worker with the highest
``fbi_hash("<session id>:<worker url>")`` (vllm-router ``select_least_loaded``; on equal scores
the earlier candidate wins). A pure-Python ``fbi_hash`` costs ~10-25 us, so an idle pool of 64
workers would cost over a millisecond per new session. :func:`fbi_hash_many` computes the same
hashes for a batch of keys with numpy (``uint64`` arithmetic wraps modulo 2**64 like the C code),
and :func:`rendezvous_winner` uses it above :data:`BATCH_MIN` candidates.

The batch follows :mod:`sessionroute.router.policies.hashing` step by step: MurmurHash64A of
each key, furc's bit stream of nine blocks (block ``i`` is the rehash of block ``i - 1``), the
first furc try (highest set bit ``d`` of block 0's low 24 bits, then the bits at
``d + 23*j``), and the final MurmurHash64A of the 4-byte bucket. The 2**-22-rare keys whose
first try fails fall back to the scalar :func:`sessionroute.router.policies.hashing.fbi_hash`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from sessionroute.router.policies.hashing import FURC_MAX, FURC_SEED, fbi_hash, rendezvous_score

__all__ = ["BATCH_MIN", "fbi_hash_many", "rendezvous_winner"]

BATCH_MIN = 16
"""Below this many candidates the scalar hash is faster than the numpy batch."""

_U64: TypeAlias = npt.NDArray[np.uint64]
_MASK = 0xFFFFFFFFFFFFFFFF
_MI = 0xC6A4A7935BD1E995
_M = np.uint64(_MI)
_R = np.uint64(47)
_H8 = np.uint64((FURC_SEED ^ ((8 * _MI) & _MASK)) & _MASK)
_H4 = np.uint64((FURC_SEED ^ ((4 * _MI) & _MASK)) & _MASK)
_LOW24 = np.uint64(0xFFFFFF)
_SEED = np.uint64(FURC_SEED)
_3 = np.uint64(3)
_7 = np.uint64(7)
_NBLOCKS = 9  # furc's first try reads bits up to 23 + 23 * 22 = 529 < 9 * 64


def _weights() -> npt.NDArray[np.int64]:
    """Row ``d + 1``: the furc bucket as a weighted sum of the 576-bit stream, for ``d``.

    For ``d >= 2`` the bucket is ``2**(d-1) + sum(bit(d + 23*j) << (d - 1 - j))`` over
    ``j = 1 .. d-1``; the leading 1 is weight on bit ``d`` (always set). ``d`` in {0, 1} gives
    bucket 1 (weight on the set bit ``d``), ``d = -1`` (row 0) gives bucket 0.
    """
    w = np.zeros((25, _NBLOCKS * 64), dtype=np.int64)
    for d in range(24):
        if d <= 1:
            w[d + 1, d] = 1
            continue
        w[d + 1, d] = 1 << (d - 1)
        for j in range(1, d):
            w[d + 1, d + 23 * j] = 1 << (d - 1 - j)
    return w


_WEIGHTS = _weights()


def _fmix(h: _U64) -> _U64:
    h ^= h >> _R
    h *= _M
    h ^= h >> _R
    return h


def _murmur_many(keys: Sequence[bytes]) -> _U64:
    """MurmurHash64A (seed ``FURC_SEED``) of each key; blocks past a key's end are masked."""
    count = len(keys)
    lens = [len(k) for k in keys]
    lo, hi = min(lens), max(lens)
    width = (hi >> 3) + 1  # every key gets at least one zero-padded (tail) block
    row = width * 8
    buf = b"".join([k + b"\0" * (row - n) for k, n in zip(keys, lens, strict=True)])
    blocks = np.frombuffer(buf, dtype="<u8").reshape(count, width).astype(np.uint64)
    n = np.array(lens, dtype=np.uint64)
    h = (n * _M) ^ _SEED
    nb = n >> _3
    for c in range(hi >> 3):
        k = blocks[:, c] * _M
        k ^= k >> _R
        k *= _M
        k ^= h
        k *= _M
        h = k if c < lo >> 3 else np.where(nb > c, k, h)
    # The zero-padded block at index len // 8 equals the little-endian tail value.
    tail = blocks[np.arange(count), nb.astype(np.intp)] if lo != hi else blocks[:, hi >> 3]
    with_tail = (tail ^ h) * _M
    h = np.where((n & _7) != 0, with_tail, h)
    return _fmix(h)


def fbi_hash_many(keys: Sequence[bytes]) -> list[int]:
    """``[fbi_hash(k) for k in keys]``, computed in one numpy batch (same 64-bit values).

    Args:
        keys: byte strings (encode str keys as UTF-8 first).

    Returns:
        One unsigned 64-bit hash per key, in order.
    """
    if not keys:
        return []
    b0 = _murmur_many(keys)
    # Highest set bit of the low 24 bits (exact in float64); -1 when they are all zero.
    d = np.frexp((b0 & _LOW24).astype(np.float64))[1].astype(np.int64) - 1
    blocks = np.empty((len(keys), _NBLOCKS), dtype=np.uint64)
    blocks[:, 0] = b0
    cur = b0
    for i in range(1, _NBLOCKS):
        k = cur * _M
        k ^= k >> _R
        k *= _M
        k ^= _H8
        k *= _M
        cur = _fmix(k)
        blocks[:, i] = cur
    bits = np.unpackbits(blocks.view(np.uint8), axis=1, bitorder="little")
    # bucket = sum of bit(p) * weight_d(p) over the bit stream, plus the leading 1.
    bucket = np.einsum("ij,ij->i", bits, _WEIGHTS[d + 1], dtype=np.int64)
    h = bucket.astype(np.uint64) ^ _H4
    h *= _M
    out: list[int] = _fmix(h).tolist()
    for i in np.flatnonzero(bucket >= FURC_MAX).tolist():
        out[i] = fbi_hash(keys[i])
    return out


def rendezvous_winner(session_id: str, candidates: Sequence[str]) -> str:
    """The candidate with the highest ``fbi_hash("<session_id>:<candidate>")``.

    On equal scores the earlier candidate wins, as in vllm-router's ``select_least_loaded``.

    Raises:
        ValueError: if ``candidates`` is empty.
    """
    if not candidates:
        raise ValueError("rendezvous_winner needs at least one candidate")
    if len(candidates) == 1:
        return candidates[0]
    if len(candidates) < BATCH_MIN:
        return max(candidates, key=lambda w: rendezvous_score(session_id, w))
    scores = fbi_hash_many([f"{session_id}:{w}".encode() for w in candidates])
    best = 0
    best_score = scores[0]
    for i in range(1, len(scores)):
        if scores[i] > best_score:
            best, best_score = i, scores[i]
    return candidates[best]
