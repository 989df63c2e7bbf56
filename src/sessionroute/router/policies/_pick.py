"""Lowest-score choice with a fair tie-break, shared by the score-based peer policies."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["LowestScore"]


class LowestScore:
    """Picks the candidate with the lowest score; ties go to the least recently chosen
    (never-chosen first, then the earlier candidate). Each pick records its choice with a
    logical counter, not the clock, so the policy stays deterministic."""

    __slots__ = ("_last", "_tick")

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._tick = 0

    def pick(self, candidates: Sequence[str], scores: Sequence[float]) -> str:
        """The chosen candidate (``candidates`` non-empty, ``scores`` aligned with it)."""
        best = min(scores)
        if scores.count(best) == 1:
            chosen = candidates[scores.index(best)]
        else:
            last = self._last
            chosen = min(
                (w for w, s in zip(candidates, scores, strict=True) if s == best),
                key=lambda w: last.get(w, -1),
            )
        self._tick += 1
        self._last[chosen] = self._tick
        return chosen
