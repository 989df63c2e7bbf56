"""vllm-router's request rate limit: a token bucket in front of placement (pure, clock-free).

vllm-router 0.1.17's ``--max-concurrent-requests`` (C) is the bucket's capacity and
``--rate-limit-tokens-per-second`` (R, default C) its refill rate: a request takes a token
to be placed and gives it back when it completes; tokens never exceed C. A request that finds
no token waits in the router core's admission queue (``--queue-size``, FIFO, oldest first)
for up to ``--queue-timeout-secs``, served by a token a completing request gives back (or at
the next arrival, oldest first), not by the refill alone, as vllm-router's queue; a full queue
(or ``--queue-size 0``) is refused at once.
Statuses as vllm-router's (measured with its binary): 429 with ``Retry-After: 1`` when
refused, 408 when the wait timed out. Because the bucket also refills with time, C bounds
bursts rather than strictly the requests in flight, as in vllm-router.
"""

from __future__ import annotations

__all__ = ["TokenBucket"]


class TokenBucket:
    """A token bucket.

    Args:
        capacity: most tokens held (>= 1); the bucket starts full.
        rate: tokens added per second (> 0).
        now: the clock's time at creation (seconds).
    """

    __slots__ = ("_last", "capacity", "rate", "tokens")

    def __init__(self, capacity: float, rate: float, now: float) -> None:
        if capacity < 1 or rate <= 0:
            raise ValueError(
                f"token bucket needs capacity >= 1 and rate > 0, got {capacity}, {rate}"
            )
        self.capacity = capacity
        self.rate = rate
        self.tokens = float(capacity)
        self._last = now

    def _refill(self, now: float) -> None:
        if now > self._last:
            self.tokens = min(self.capacity, self.tokens + (now - self._last) * self.rate)
            self._last = now

    def take(self, now: float) -> bool:
        """Take one token at time ``now``; False (nothing taken) when none is left."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def give_back(self) -> None:
        """A request that held a token completed: return it (up to the capacity)."""
        self.tokens = min(self.capacity, self.tokens + 1.0)

    def wait_s(self, now: float) -> float:
        """Seconds until a token is there at the refill rate alone (0 when one is)."""
        self._refill(now)
        return max(0.0, (1.0 - self.tokens) / self.rate)
