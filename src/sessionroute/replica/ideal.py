"""The ideal hit rate of an arm (``shared/WORKLOADS.md``): every reusable prefix token hits.

With an infinite cache shared by the whole fleet, a request's ideal hit is the longest prefix
of its prompt blocks seen before (in any earlier request's prompt or output, same
``cache_salt``), at most ``prompt_len - 1`` tokens like vLLM. Because keys are chained, "seen"
is prefix-closed and the longest prefix is found by galloping back from the prompt's last
block, then bisecting. The simulator and the live host both feed every submitted turn through
one :class:`IdealCache`.

It is a prefix cache model (the bound the replicas' finite caches are measured against), so it
lives with the replica model and is compiled with it (:mod:`sessionroute.native`).
"""

from __future__ import annotations

__all__ = ["IdealCache"]


class IdealCache:
    """An infinite, fleet-wide prefix cache of block keys, per cache salt.

    Args:
        block_size: tokens per block of the keys.

    Attributes:
        queried_tokens: prompt tokens looked up so far.
        hit_tokens: ideal hit tokens so far.
    """

    __slots__ = ("_seen", "block_size", "hit_tokens", "queried_tokens")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._seen: dict[str | None, set[int]] = {}
        self.queried_tokens = 0
        self.hit_tokens = 0

    def observe(self, keys: list[int], prompt_len: int, output_len: int, salt: str | None) -> int:
        """Look up a request's prompt, then remember all its blocks; returns ideal hit tokens.

        ``keys``: the request's chained block keys.
        """
        seen = self._seen.get(salt)
        if seen is None:
            seen = self._seen[salt] = set()
        bs = self.block_size
        n_prompt = min(prompt_len // bs, len(keys))
        # keys[:lo] are seen and keys[hi:n_prompt] are not (seen keys form a prefix). A turn
        # usually adds a few blocks to a prefix seen before, so gallop back from the end
        # (probes at hi - 1, hi - 2, hi - 4, ...), then bisect the last gap.
        lo, hi = 0, n_prompt
        step = 1
        while lo < hi:
            i = max(hi - step, lo)
            if keys[i] in seen:
                lo = i + 1
                break
            hi = i
            step += step
        while lo < hi:
            mid = (lo + hi) // 2
            if keys[mid] in seen:
                lo = mid + 1
            else:
                hi = mid
        hit = min(lo * bs, prompt_len - 1)
        n_all = min(len(keys), (prompt_len + output_len) // bs)
        seen.update(keys[lo:n_all])
        self.queried_tokens += prompt_len
        self.hit_tokens += hit
        return hit

    @property
    def hit_rate(self) -> float:
        """Ideal hit tokens over queried tokens (0.0 before any request)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
