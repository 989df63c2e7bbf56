"""``bisect_left`` / ``bisect_right`` on sorted ``list[int]`` (segment starts, holes, cached
starts of the run-length pool).

Same results as :mod:`bisect` (CPython ``Modules/_bisectmodule.c``); written out, typed, so the
compiled build runs the searches on ints.
"""

from __future__ import annotations

__all__ = ["bisect_left", "bisect_right"]


def bisect_left(a: list[int], x: int, lo: int = 0, hi: int = -1) -> int:
    """The first index ``i >= lo`` with ``a[i] >= x`` (``hi``, default ``len(a)``, if none).

    Raises:
        ValueError: if ``lo`` is negative.
    """
    if lo < 0:
        raise ValueError("lo must be non-negative")
    if hi == -1:
        hi = len(a)
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def bisect_right(a: list[int], x: int, lo: int = 0, hi: int = -1) -> int:
    """The first index ``i >= lo`` with ``a[i] > x`` (``hi``, default ``len(a)``, if none).

    Raises:
        ValueError: if ``lo`` is negative.
    """
    if lo < 0:
        raise ValueError("lo must be non-negative")
    if hi == -1:
        hi = len(a)
    while lo < hi:
        mid = (lo + hi) >> 1
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo
