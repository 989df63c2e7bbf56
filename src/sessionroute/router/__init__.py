"""The sans-I/O router: everything between "a request arrived" and "send it to worker W".

Both drivers call it: the simulator (:mod:`sessionroute.sim`, virtual time) and the HTTP
server (:mod:`sessionroute.serve`, real sockets). Nothing here imports asyncio, an HTTP
library or the wall clock; time comes from an injected :class:`~sessionroute.clock.Clock`.

* :mod:`~sessionroute.router.core`: select + reserve, release exactly once, decision log;
* :mod:`~sessionroute.router.policies`: the policies and their registry;
* :mod:`~sessionroute.router.state`: the cluster view and the session table;
* :mod:`~sessionroute.router.hashing`: vllm-router's ``fbi_hash`` (consistent and rendezvous
  hashing).
"""

from sessionroute.router.core import Reservation, RoutingCore

__all__ = ["Reservation", "RoutingCore"]
