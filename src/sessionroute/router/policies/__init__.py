"""Routing policies: pure, synchronous state machines (see
:mod:`sessionroute.router.policies.base`)."""

from sessionroute.router.policies.base import Policy, least_loaded_of, require_healthy
from sessionroute.router.policies.registry import (
    BUILTIN_POLICIES,
    SESSION_POLICIES,
    PolicyChoice,
    choose_policy,
    create_policy,
    policy_class,
    policy_names,
)

__all__ = [
    "BUILTIN_POLICIES",
    "SESSION_POLICIES",
    "Policy",
    "PolicyChoice",
    "choose_policy",
    "create_policy",
    "least_loaded_of",
    "policy_class",
    "policy_names",
    "require_healthy",
]
