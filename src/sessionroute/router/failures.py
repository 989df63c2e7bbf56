"""Failed and answered attempts in the router core: the one retry-or-refuse decision for both
drivers (:class:`AttemptOutcomes`, a base of :class:`~sessionroute.router.core.RoutingCore`;
the schedule and the rules are :mod:`sessionroute.router.retry`'s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sessionroute.errors import NoWorkerAvailable
from sessionroute.router.actions import Refuse, Retry
from sessionroute.router.retry import AttemptFailure, RetryPolicy, WorkerLostAction
from sessionroute.router.state.cluster import Cluster

if TYPE_CHECKING:
    from sessionroute.router.core import Reservation

__all__ = ["AttemptOutcomes"]


class AttemptOutcomes:
    """What follows an attempt (module docstring); the core's attributes it reads are set by
    :class:`~sessionroute.router.core.RoutingCore`."""

    cluster: Cluster
    retry: RetryPolicy

    if TYPE_CHECKING:

        def complete(self, reservation: Reservation) -> bool: ...

        def retarget(self, reservation: Reservation) -> Reservation: ...

        def record_failure(self, url: str) -> float | None: ...

        def record_success(self, url: str) -> bool: ...

        def record_unreachable(self, url: str, reason: str) -> float | None: ...

    def attempt_failed(
        self, reservation: Reservation, failure: AttemptFailure, attempt: int, detail: str
    ) -> Retry | Refuse:
        """Attempt number ``attempt`` (1-based) of ``reservation`` failed before any byte of
        its answer reached the client: record it against the worker and decide.

        A refused connection or a worker given up as hung (``CONNECT``, ``HUNG``) marks the
        worker unavailable at once (:meth:`record_unreachable`), so the retry places the
        request again without waiting; a broken connection (``UNSENT``, ``SENT``) or a timeout
        counts towards its circuit (:meth:`record_failure`). A timeout is answered 504; a
        failure after the request was sent is retried only with ``retry_after_send``
        (:mod:`sessionroute.router.retry`); otherwise the request is retried after the
        backoff until ``retry_max_attempts`` attempts were made, then answered 502.

        Args:
            reservation: the failed attempt's reservation.
            failure: how it failed.
            attempt: attempts made so far, this one included.
            detail: what happened, for the client's error message.

        Returns:
            :class:`Retry` (wait, then :meth:`next_attempt`), or :class:`Refuse` (the
            reservation is released).
        """
        url = reservation.worker
        if failure is AttemptFailure.CONNECT or failure is AttemptFailure.HUNG:
            self.record_unreachable(url, detail)
        else:
            self.record_failure(url)
        if failure is AttemptFailure.TIMEOUT:
            return self._refuse(reservation, 504, "upstream_timeout", detail)
        if not self.retry.may_retry(failure):
            return self._refuse(
                reservation,
                502,
                "upstream_error",
                f"upstream failed after the request was sent ({detail}); not retried, as it "
                "may have started there (--retry-after-send retries it)",
            )
        wait_s = self.retry.after_failure(attempt, self.cluster.is_healthy(url))
        if wait_s is None:
            return self._refuse(
                reservation,
                502,
                "upstream_unreachable",
                f"upstream unreachable after {attempt} attempt(s): {detail}",
            )
        return Retry(reservation, wait_s)

    def attempt_answered(self, reservation: Reservation, status: int, attempt: int) -> Retry | None:
        """Attempt number ``attempt`` (1-based) was answered with ``status``: recorded as a
        success below 500, a failure from 500; a retried status
        (:data:`~sessionroute.router.retry.RETRY_STATUSES`) with attempts left is retried.

        Returns:
            :class:`Retry`, or None: relay this answer to the client.
        """
        url = reservation.worker
        if status < 500:
            self.record_success(url)
        else:
            self.record_failure(url)
        retry = self.retry
        if status not in retry.retried_statuses or attempt >= retry.max_attempts:
            return None
        wait_s = retry.after_failure(attempt, self.cluster.is_healthy(url))
        return None if wait_s is None else Retry(reservation, wait_s)

    def next_attempt(self, reservation: Reservation, last_error: str) -> Reservation | Refuse:
        """The reservation for the attempt after a :class:`Retry`'s wait (:meth:`retarget`),
        or :class:`Refuse` (503) when it must move and no worker is available."""
        try:
            return self.retarget(reservation)
        except NoWorkerAvailable:
            return self._refuse(
                reservation,
                503,
                "no_worker_available",
                f"no worker available (last error: {last_error})",
            )

    def _refuse(self, reservation: Reservation, status: int, code: str, message: str) -> Refuse:
        self.complete(reservation)
        return Refuse(status, code, message)

    def on_worker_lost(self, client_started: bool) -> WorkerLostAction:
        """What to do with a request in flight on a worker that was lost
        (:class:`WorkerLost`), by whether its answer to the client has started: re-place it
        (cancel it there; it fails as ``HUNG`` and :meth:`attempt_failed` places it again) or
        watch it (:meth:`~sessionroute.router.retry.RetryPolicy.on_worker_lost`)."""
        return self.retry.on_worker_lost(client_started)
