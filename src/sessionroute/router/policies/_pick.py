"""Lowest-score choice with a fair tie-break, shared by the score-based peer policies."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["LowestScore"]


class LowestScore:
    """Picks the candidate with the lowest score; ties go to the least recently chosen
    (never-chosen first, then the earlier candidate). Each pick records its choice in a
    recency order (not the clock), so the policy stays deterministic.

    A tie among many candidates (every worker idle, say) costs one pass over the tied ones plus
    a walk of the recency order from its oldest end, not a keyed sort.
    """

    __slots__ = ("_order",)

    def __init__(self) -> None:
        self._order: dict[str, None] = {}  # chosen workers, least recently chosen first

    def pick(self, candidates: Sequence[str], scores: Sequence[float]) -> str:
        """The chosen candidate (``candidates`` non-empty, ``scores`` aligned with it)."""
        best = min(scores)
        order = self._order
        if scores.count(best) == 1:
            chosen = candidates[scores.index(best)]
        else:
            tied = [w for w, s in zip(candidates, scores, strict=True) if s == best]
            for w in tied:
                if w not in order:  # never chosen: the earliest such candidate
                    chosen = w
                    break
            else:
                members = set(tied)
                chosen = next(w for w in order if w in members)
        order.pop(chosen, None)
        order[chosen] = None
        return chosen

    def forget(self, worker: str) -> None:
        """Drop ``worker`` from the recency order (it left the cluster)."""
        self._order.pop(worker, None)
