"""Shared helpers of the peer-policy rule tests: a two- or three-worker core and requests."""

from __future__ import annotations

import random
from typing import Any

from sessionroute.clock import ManualClock
from sessionroute.router import RouterConfig, RoutingCore
from sessionroute.router.policies import create_policy
from sessionroute.router.state import Cluster
from sessionroute.types import EngineGauges, RouteRequest

A, B, C = "http://a", "http://b", "http://c"


def make_core(
    name: str,
    options: dict[str, Any] | None = None,
    workers: tuple[str, ...] = (A, B),
    *,
    clock: ManualClock | None = None,
    seed: int = 0,
    config: RouterConfig | None = None,
) -> RoutingCore:
    """A core over ``workers`` with policy ``name`` and its ``options``."""
    policy = create_policy(
        name, options, clock=clock if clock is not None else ManualClock(), rng=random.Random(seed)
    )
    return RoutingCore(policy, Cluster(workers), config, log=[])


def req(
    blocks: list[int] | range | None = None,
    tokens: int | None = None,
    sid: str | None = None,
    rid: str | None = None,
) -> RouteRequest:
    """A request of ``blocks`` content blocks (16 tokens each unless ``tokens`` is given)."""
    keys = None if blocks is None else list(blocks)
    n = tokens if tokens is not None else 16 * len(keys or [])
    return RouteRequest(session_id=sid, prompt_tokens=n, blocks=keys, request_id=rid)


def gauges(core: RoutingCore, url: str, kv: float, waiting: int = 0, running: int = 0) -> None:
    """Set ``url``'s scraped gauges (a new object: a new poll)."""
    core.observe_gauges(url, EngineGauges(running, waiting, kv))
