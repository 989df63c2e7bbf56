"""Startup: waiting for the workers (vllm-router's ``--worker-startup-timeout-secs`` and
``--worker-startup-check-interval``), and what the probe endpoints report meanwhile.

vllm-router 0.1.17 checks every worker's health endpoint every
``--worker-startup-check-interval`` seconds (30) before it binds its port, and exits with
status 1 when one of them has not answered a check by ``--worker-startup-timeout-secs`` (600).
``sessionroute serve`` keeps both flags, their defaults and their meaning (a worker counts
healthy only once a check passed; a worker that passes no check by the timeout is reported by
name), with two differences an operator running vLLM behind Kubernetes or systemd wants:

* the router binds its port once the first check of every worker has returned (at most
  ``--health-check-timeout-secs``), so ``/liveness`` answers while vLLM is still loading its
  model and ``/readiness`` says 503 until one worker passed a check;
* at the timeout it exits (status 1) only when *no* worker ever passed a check; workers still
  down then are logged by name and stay in the regular health checks, and join when they pass.

A worker that comes up during the wait is routed to after its first passing check: within one
``--worker-startup-check-interval`` (and within ``--health-recheck-interval-secs``, which also
checks every unhealthy worker between rounds), not after ``--health-success-threshold`` checks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from sessionroute.router.startup import StartupWait

if TYPE_CHECKING:
    from sessionroute.serve.router import Router

__all__ = ["StartupTimeout", "not_started", "wait_for_workers"]

log = logging.getLogger("sessionroute.serve")


class StartupTimeout(RuntimeError):
    """No worker passed a health check within ``--worker-startup-timeout-secs``."""


def not_started(router: Router) -> list[str]:
    """The workers that have not passed a health check yet, in the order they were given."""
    return [url for url, wh in router.workers.items() if not wh.started]


async def wait_for_workers(router: Router) -> None:
    """Check the workers that have not passed a check every ``--worker-startup-check-interval``
    seconds until all have, or ``--worker-startup-timeout-secs`` have passed since the call.

    At the timeout, when no worker has passed a check, :attr:`Router.fatal_error` is set and
    :attr:`Router.on_fatal` called (``sessionroute serve`` then shuts down and exits with
    status 1, as vllm-router does); when some have, the others are logged as a warning and
    left to the regular health checks.
    """
    s = router.settings
    checker = router.health
    if checker is None:
        raise RuntimeError("router not started")
    loop = asyncio.get_running_loop()
    config = router.core.config
    wait = StartupWait(
        loop.time(), config.worker_startup_timeout_s, config.worker_startup_check_interval_s
    )
    pending = not_started(router)
    if pending:
        log.info(
            "waiting for %d worker(s) to pass a health check (timeout %g s, every %g s): %s",
            len(pending),
            wait.timeout_s,
            wait.interval_s,
            pending,
        )
    while pending and (pause := wait.next_check_in(loop.time())) is not None:
        await asyncio.sleep(pause)
        await checker.check_once(not_started(router))
        pending = not_started(router)
    outcome = wait.outcome(len(pending), len(router.workers))
    if outcome == "ready":
        if router.workers:
            log.info("all %d worker(s) passed a health check", len(router.workers))
        return
    if outcome == "partial":
        log.warning(
            "after %g s (--worker-startup-timeout-secs) these workers have not passed a health "
            "check; routing to the others, and checking these every "
            "--health-recheck-interval-secs: %s",
            wait.timeout_s,
            pending,
        )
        return
    message = (
        f"Timeout {wait.timeout_s:g}s waiting for workers {pending} to pass a "
        f"health check ({s.health_check_endpoint}); start them, or set "
        "--worker-startup-timeout-secs to a larger value"
    )
    log.error("%s", message)
    router.fatal_error = message
    if router.on_fatal is not None:
        router.on_fatal()
