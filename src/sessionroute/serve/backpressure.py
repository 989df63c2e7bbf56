"""``GET /backpressure``: the router core's backpressure document
(:func:`sessionroute.router.backpressure.snapshot`, which says what it holds and when the
router counts as saturated)."""

from __future__ import annotations

from sessionroute.router.backpressure import snapshot
from sessionroute.serve.http1 import Request
from sessionroute.serve.router import Router
from sessionroute.serve.wire import Response, json_response

__all__ = ["backpressure"]


async def backpressure(request: Request, router: Router) -> Response:
    """``GET /backpressure``."""
    return json_response(snapshot(router.core))
