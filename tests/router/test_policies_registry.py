"""The registry: every built-in loads; user policies load from ``module:Class``; unknown names
and options fail with errors that name the offending value."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from sessionroute.clock import Clock, ManualClock
from sessionroute.errors import ConfigError, UnknownPolicyError
from sessionroute.router.core import RoutingCore
from sessionroute.router.policies import (
    BUILTIN_POLICIES,
    Policy,
    create_policy,
    policy_class,
    policy_names,
    require_healthy,
)
from sessionroute.router.state import Cluster, ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

W = ["http://a", "http://b", "http://c"]


@dataclass(frozen=True, slots=True)
class LastHealthyConfig:
    """Options of the test policy."""

    offset: int = 0


class LastHealthyPolicy(Policy):
    """A user policy: the ``offset``-th healthy worker from the end."""

    name: ClassVar[str] = "last_healthy"
    Config: ClassVar[type[Any] | None] = LastHealthyConfig

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        self.completed = 0

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        return Decision(healthy[-1 - self.config.offset], DecisionKind.STATELESS)

    def on_complete(self, request: RouteRequest, worker: str) -> None:
        self.completed += 1


class NotAPolicy:
    """Importable but not a Policy subclass."""


def test_user_policy_loads_from_module_colon_class() -> None:
    policy = create_policy(f"{__name__}:LastHealthyPolicy", {"offset": 1}, clock=ManualClock())
    assert isinstance(policy, LastHealthyPolicy)
    core = RoutingCore(policy, Cluster(W))
    res = core.route(RouteRequest(session_id="s"))
    assert res.worker == "http://b"
    core.complete(res)
    assert policy.completed == 1
    assert policy_class(f"{__name__}:LastHealthyPolicy") is LastHealthyPolicy


def test_every_builtin_loads_and_routes() -> None:
    assert policy_names() == list(BUILTIN_POLICIES)
    for name in policy_names():
        policy = create_policy(name, clock=ManualClock(), seed=1)
        assert policy.name == name
        core = RoutingCore(policy, Cluster(W))
        res = core.route(RouteRequest(session_id="s", blocks=[1, 2]))
        assert res.worker in W
        assert core.complete(res) is True


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("least-loaded", "least-loaded"),
        ("no_such_module_xyz:Policy", "no_such_module_xyz"),
        (
            f"{__name__}:NotAPolicy",
            "NotAPolicy' is not a sessionroute.router.policies.Policy subclass",
        ),
        (f"{__name__}:Missing", "has no attribute 'Missing'"),
        (":Class", ":Class"),
    ],
)
def test_unknown_policy_names_are_clear(name: str, needle: str) -> None:
    with pytest.raises(UnknownPolicyError, match=needle):
        create_policy(name, clock=ManualClock())


@pytest.mark.parametrize(
    ("name", "options", "needle"),
    [
        ("round_robin", {"weights": [1]}, "weights"),
        ("sticky_least_loaded", {"session_ttl_s": 0}, "0"),
        ("consistent_hash_bounded_load", {"c": 0.5}, "0.5"),
        ("consistent_hash_bounded_load", {"cc": 2}, "cc"),
        ("cache_aware", {"cache_threshold": -0.1}, "-0.1"),
        (f"{__name__}:LastHealthyPolicy", {"offset": 1, "bogus": True}, "bogus"),
        # a value of the wrong type is named, not Python's "'>=' not supported ..."
        ("kv_cost", {"temperature": "abc"}, "temperature must be a number, got 'abc'"),
        ("consistent_hash_bounded_load", {"c": True}, "c must be a number, got True"),
    ],
)
def test_bad_options_are_clear(name: str, options: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        create_policy(name, options, clock=ManualClock())


def test_unknown_policy_error_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        create_policy("nope", clock=ManualClock())


class HoldingPolicy(LastHealthyPolicy):
    """Holds every request while ``hold`` (an admit of its own)."""

    hold = True

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        return not self.hold


class InheritingPolicy(HoldingPolicy):
    """Overrides neither hook: both are inherited from its parents, not Policy's."""


@pytest.mark.parametrize("cls", [HoldingPolicy, InheritingPolicy])
def test_the_core_asks_hooks_that_a_policy_or_its_parents_override(
    cls: type[HoldingPolicy],
) -> None:
    """The core skips admit and on_complete only when they are Policy's own defaults."""
    from sessionroute.router.admission import Ticket

    policy = cls(clock=ManualClock(), rng=random.Random(0))
    core = RoutingCore(policy, Cluster(W))
    readied: list[Any] = []
    assert isinstance(core.place(RouteRequest(session_id="s"), readied.append), Ticket)
    policy.hold = False
    res = core.place(RouteRequest(session_id="t"), readied.append)
    assert not isinstance(res, Ticket)
    core.complete(res)
    assert policy.completed >= 1
