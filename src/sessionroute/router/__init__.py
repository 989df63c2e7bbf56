"""The sans-I/O router: everything between "a request arrived" and "send it to worker W".

Both drivers call it: the simulator (:mod:`sessionroute.sim`, virtual time) and the HTTP
server (:mod:`sessionroute.serve`, real sockets). Nothing here imports asyncio, an HTTP
library or the wall clock; time comes from an injected :class:`~sessionroute.clock.Clock`.

* :mod:`~sessionroute.router.core`: :class:`RoutingCore`, select + reserve, release exactly
  once, decision log; its actions and timers (:mod:`~sessionroute.router.actions`), worker
  availability (:mod:`~sessionroute.router.availability`), failed attempts
  (:mod:`~sessionroute.router.failures`);
* :mod:`~sessionroute.router.build`: :func:`build_router`, the one construction for both
  drivers;
* :mod:`~sessionroute.router.requests`: the one builder of the policy's request;
* :mod:`~sessionroute.router.retry`: the one retry / backoff / re-place decision;
* :mod:`~sessionroute.router.admission`: the admission queue before placement;
* :mod:`~sessionroute.router.health`: circuit breakers and health verdicts;
* :mod:`~sessionroute.router.config`: :class:`RouterConfig`, read by ``serve`` and experiments;
* :mod:`~sessionroute.router.policies`: the policies, their registry and :class:`PolicyChoice`;
* :mod:`~sessionroute.router.state`: the cluster view and the session table;
* :mod:`~sessionroute.router.policies.hashing`: vllm-router's ``fbi_hash`` (consistent and
  rendezvous hashing).
"""

from sessionroute.router.build import build_router, policy_choice
from sessionroute.router.config import RouterConfig
from sessionroute.router.core import Reservation, RoutingCore
from sessionroute.router.policies.registry import PolicyChoice, choose_policy

__all__ = [
    "PolicyChoice",
    "Reservation",
    "RouterConfig",
    "RoutingCore",
    "build_router",
    "choose_policy",
    "policy_choice",
]
