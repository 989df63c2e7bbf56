"""Request ids the router generates for requests that bring none (vllm-router's format)."""

from __future__ import annotations

import random
import string

__all__ = ["RequestIds"]

_ALNUM = string.ascii_letters + string.digits
_ID_TABLE = bytes(ord(_ALNUM[i % len(_ALNUM)]) for i in range(256))
"""Maps a random byte to an alphanumeric (the slight bias toward 8 letters is harmless)."""
_ID_PREFIX = {"/v1/chat/completions": "chatcmpl-", "/v1/completions": "cmpl-"}
_ID_SEQ_START = 10**11
"""The first sequence number of generated request ids (the smallest with 12 digits)."""


class RequestIds:
    """Generates request ids (:meth:`new`).

    Args:
        rng: draws the ids' random part, once.
    """

    def __init__(self, rng: random.Random) -> None:
        base = rng.randbytes(12).translate(_ID_TABLE).decode()
        self._heads = {path: prefix + base for path, prefix in _ID_PREFIX.items()}
        """The ids' first 21 or 17 characters (prefix and random part) by route."""
        self._other = "req-" + base
        self._seq = _ID_SEQ_START

    def new(self, path: str) -> str:
        """``chatcmpl-``/``cmpl-``/``req-`` + 24 alphanumerics (vllm-router's format).

        The 24 characters are 12 random ones drawn once per router and a 12-digit sequence
        number: unique within the router without a random draw per request. The sequence
        runs over the 12-digit numbers (10**11 up to 10**12 - 1, then again), so it needs no
        zero padding.
        """
        seq = self._seq + 1
        self._seq = seq = seq if seq < 10**12 else _ID_SEQ_START
        return self._heads.get(path, self._other) + str(seq)
