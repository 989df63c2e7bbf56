"""One way to build a router: :func:`build_router`, used by ``serve`` and the simulator.

Both drivers build the same thing from the same settings: the policy chosen by name with the
router's session TTL and table size as its defaults (:func:`policy_choice`), the cluster of
workers, and the :class:`~sessionroute.router.RoutingCore` over them with the router's
:class:`~sessionroute.router.config.RouterConfig`. What differs is passed in, never probed:
the clock (real or virtual), the random generators (seeded by the driver), a shared cluster
(``serve --state-url``) and a wrapper of the policy (the simulator's several routers).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sessionroute.clock import Clock
from sessionroute.router.config import RouterConfig
from sessionroute.router.core import RoutingCore
from sessionroute.router.kv.content import KvContent
from sessionroute.router.policies.base import Policy
from sessionroute.router.policies.registry import PolicyChoice, choose_policy
from sessionroute.router.state.cluster import Cluster

__all__ = ["build_router", "policy_choice"]


def policy_choice(
    config: RouterConfig, policy: str, options: Mapping[str, Any] | None = None
) -> PolicyChoice:
    """The policy ``policy`` (registry name or ``module:Class``) with ``options``, its
    session TTL and table size defaulting to ``config``'s.

    Raises:
        UnknownPolicyError: unknown name. ConfigError: invalid options.
    """
    return choose_policy(
        policy,
        options,
        session_ttl_s=config.session_ttl_s,
        session_table_max_bytes=config.session_table_max_bytes,
    )


def build_router(
    config: RouterConfig,
    clock: Clock,
    rng: random.Random,
    *,
    choice: PolicyChoice,
    workers: Sequence[str],
    policy_rng: random.Random | None = None,
    wrap: Callable[[Policy], Policy] | None = None,
    cluster: type[Cluster] = Cluster,
    kv_content: KvContent | None = None,
) -> RoutingCore:
    """The routing core for ``workers``.

    Args:
        config: the router's settings.
        clock: the time source of the policy, the circuits and the core's timers.
        rng: the core's random generator (retry jitter).
        choice: the policy (:func:`policy_choice`).
        workers: the workers' base URLs.
        policy_rng: the policy's random generator (default: seeded from ``rng``).
        wrap: replaces the built policy (the simulator's router fleet), or None.
        cluster: the cluster class (a shared one for ``--state-url``).
        kv_content: the servers' tokenizer and block-hash scheme, or None.
    """
    prng = policy_rng if policy_rng is not None else random.Random(rng.getrandbits(64))
    policy = choice.build(clock=clock, rng=prng)
    if wrap is not None:
        policy = wrap(policy)
    return RoutingCore(
        policy, cluster(list(workers)), config, rng=rng, clock=clock, kv_content=kv_content
    )
