"""Failed and answered attempts in the router core: the one retry-or-refuse decision for both
drivers (:class:`AttemptOutcomes`, a base of :class:`~sessionroute.router.core.RoutingCore`;
the schedule and the rules are :mod:`sessionroute.router.retry`'s).

An attempt ends in one of three events, each recorded against its worker and answered with
what the driver does next:

* :meth:`~AttemptOutcomes.attempt_failed`: nothing of the answer reached the client (no
  connection, a broken connection, no response head in time, a timeout): retry or refuse;
* :meth:`~AttemptOutcomes.attempt_answered`: a response head with a status came: relay it, or
  retry a retried status;
* :meth:`~AttemptOutcomes.answer_broke`: the answer being relayed broke after its head (the
  connection broke, or the request timeout passed while the body arrived): refuse (502 or
  504), or cut the client's stream if part of it was already written.

The timers of an attempt are the core's too: :meth:`~AttemptOutcomes.first_byte_timeout_s`
says which requests get a first-byte deadline and how long it is (``serve`` arms it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sessionroute.errors import NoWorkerAvailable
from sessionroute.router.actions import Refuse, Retry
from sessionroute.router.coreparts import CoreParts
from sessionroute.router.retry import AttemptFailure, WorkerLostAction
from sessionroute.types import RouteRequest

if TYPE_CHECKING:
    from sessionroute.router.core import Reservation


__all__ = ["AttemptOutcomes"]


class AttemptOutcomes(CoreParts):
    """What follows an attempt (module docstring); the core's attributes it reads are set by
    :class:`~sessionroute.router.core.RoutingCore`."""

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
        success below 500, a failure from 500; an answer :meth:`retries_answer` retries is
        retried.

        Returns:
            :class:`Retry`, or None: relay this answer to the client.
        """
        url = reservation.worker
        if status < 500:
            self.record_success(url)
        else:
            self.record_failure(url)
        if not self.retries_answer(status, attempt):
            return None
        wait_s = self.retry.after_failure(attempt, self.cluster.is_healthy(url))
        return None if wait_s is None else Retry(reservation, wait_s)

    def retries_answer(self, status: int, attempt: int) -> bool:
        """Whether :meth:`attempt_answered` retries an answer with ``status`` to attempt
        number ``attempt``: a retried status
        (:data:`~sessionroute.router.retry.RETRY_STATUSES`) with attempts left. A driver that
        relays a complete answer without waiting asks this first."""
        retry = self.retry
        return status in retry.retried_statuses and attempt < retry.max_attempts

    def answer_broke(
        self,
        reservation: Reservation,
        failure: AttemptFailure,
        detail: str,
        *,
        started: bool = False,
    ) -> Refuse:
        """The answer of ``reservation``'s attempt broke after its response head arrived: the
        connection broke (``SENT``) or the request timeout passed (``TIMEOUT``) while its body
        was being read or relayed. Not retried (the head was taken as the answer, and a
        streamed one may have reached the client): recorded as a failure of the worker, and
        the reservation is released.

        Args:
            reservation: the attempt's reservation.
            failure: ``TIMEOUT``, or how the connection broke.
            detail: what happened (the timeout's message, or the error).
            started: part of the answer was already written to the client (a stream).

        Returns:
            The answer to the client: 504 for a timeout, else 502. When the answer had
            ``started``, the driver cuts the client's stream instead (the client saw the
            worker's head and a truncated body), and the request counts as a 502 whatever
            broke it.
        """
        url = reservation.worker
        self.record_failure(url)
        if failure is AttemptFailure.TIMEOUT and not started:
            return self._refuse(reservation, 504, "upstream_timeout", detail)
        return self._refuse(
            reservation,
            502,
            "upstream_error",
            f"upstream {url} failed while sending its response: {detail}",
        )

    def first_byte_timeout_s(self, request: RouteRequest) -> float | None:
        """Seconds the worker has to send the response head of ``request`` before it is given
        up as hung (then :meth:`attempt_failed` with ``HUNG`` places it again), or None for no
        such deadline: only streamed requests get one
        (``RouterConfig.first_byte_timeout_s``; a long non-streamed generation sends its head
        only at the end)."""
        timeout_s = self.config.first_byte_timeout_s
        return timeout_s if timeout_s and request.stream else None

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
