"""vllm-router's REST worker routes: ``POST /workers``, ``GET /workers/{url}`` and
``DELETE /workers/{url}``.

Statuses, bodies and messages as the ``vllm-router`` 0.1.17 binary answers them (measured in
front of fake workers):

* ``POST /workers`` with ``{"url": U, ...}`` (``Content-Type: application/json``; the other
  fields of vllm-router's worker config, ``model_id``, ``priority``, ``cost``, ``labels``, ...,
  are accepted and ignored): U is checked every ``--worker-startup-check-interval`` seconds
  until it passes a health check or ``--worker-startup-timeout-secs`` pass, then added:
  ``200 {"success": true, "message": "Successfully added worker: U"}``; a duplicate, a
  non-http(s) URL or the timeout: ``400 {"error": ..., "code": "ADD_WORKER_FAILED"}``;
  415 / 400 / 422 (plain text) without a JSON content type, for a body that is not JSON, or
  one without a string ``url``;
* ``GET /workers/{url}`` (the URL percent-encoded): ``200 {"url", "model_id": "unknown",
  "is_healthy"}`` (the router's view of its health), or ``404 {"error": "Worker U not found",
  "code": "WORKER_NOT_FOUND"}``;
* ``DELETE /workers/{url}``: removes it, ``200 {"success": true, "message": "Worker U
  removed successfully"}``, for an unknown URL too (an idempotent delete, as vllm-router).

A worker's URL is matched exactly, as vllm-router matches it (``http://h:8000/`` and
``http://h:8000`` are two workers): the string given at start (``--worker-urls``) or when added
is the one that shows, removes and is hashed.

Adding and removing go through :meth:`sessionroute.serve.router.Router.add_worker` and
:meth:`~sessionroute.serve.router.Router.remove_worker`, as ``/add_worker`` and
``/remove_worker`` do: the routing core learns a new worker at once (the policy may place
new sessions there), and forgets a removed one: requests in flight there finish, and its
sessions are placed again on their next turn (``decisions_total{kind="repinned"}``). Both
are admin routes (the router key, or loopback clients only without one).
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import unquote

from sessionroute.errors import WorkerError
from sessionroute.router.startup import StartupWait
from sessionroute.router.validate import worker_url_problem
from sessionroute.serve.http1 import Request
from sessionroute.serve.router import Router
from sessionroute.serve.wire import Response, json_response

__all__ = ["PREFIX", "create_worker", "delete_worker", "get_worker"]

PREFIX = "/workers/"
"""The path prefix of the routes on one worker (``/workers/{url}``)."""

_TEXT = "text/plain; charset=utf-8"


def _failed(message: str) -> Response:
    return json_response({"error": message, "code": "ADD_WORKER_FAILED"}, 400)


async def create_worker(request: Request, router: Router) -> Response:
    """``POST /workers``: add the worker of the JSON body's ``url`` once it passes a health
    check (module docstring)."""
    if request.lower.get(b"content-type", b"").split(b";")[0].strip() != b"application/json":
        return Response(415, b"Expected request with `Content-Type: application/json`", _TEXT)
    parts = await request.body()
    if parts is None:  # over the size limit: the connection answered it
        return Response(413, b"", _TEXT)
    try:
        config = json.loads(b"".join(parts))
    except ValueError as exc:
        return Response(400, f"Failed to parse the request body as JSON: {exc}".encode(), _TEXT)
    url = config.get("url") if isinstance(config, dict) else None
    if not isinstance(url, str):
        return Response(
            422,
            b"Failed to deserialize the JSON body into the target type: "
            b"missing or non-string field `url`",
            _TEXT,
        )
    if problem := worker_url_problem(url):
        return _failed(problem)
    loop = asyncio.get_running_loop()
    config = router.core.config
    wait = StartupWait(
        loop.time(), config.worker_startup_timeout_s, config.worker_startup_check_interval_s
    )
    while True:
        if url in router.core.cluster:
            return _failed(f"Worker {url} already exists")
        try:
            await router.add_worker(url)
        except WorkerError as exc:
            pause = wait.next_check_in(loop.time())
            if pause is None:
                return _failed(
                    f"Timeout {wait.timeout_s:g}s waiting for worker {url} to "
                    f"become healthy ({exc}); start it, or set --worker-startup-timeout-secs "
                    "to a larger value"
                )
            await asyncio.sleep(pause)
            continue
        return json_response({"success": True, "message": f"Successfully added worker: {url}"})


def _worker_url(request: Request) -> str:
    return unquote(request.path[len(PREFIX) :])


async def get_worker(request: Request, router: Router) -> Response:
    """``GET /workers/{url}``: one worker's record, or 404."""
    url = _worker_url(request)
    cluster = router.core.cluster
    if url not in cluster:
        return json_response({"error": f"Worker {url} not found", "code": "WORKER_NOT_FOUND"}, 404)
    return json_response({"url": url, "model_id": "unknown", "is_healthy": cluster.is_healthy(url)})


async def delete_worker(request: Request, router: Router) -> Response:
    """``DELETE /workers/{url}``: remove the worker (200 for an unknown one too)."""
    url = _worker_url(request)
    if url in router.core.cluster:  # (no await in between: nothing removes it meanwhile)
        router.remove_worker(url)
    return json_response({"success": True, "message": f"Worker {url} removed successfully"})
