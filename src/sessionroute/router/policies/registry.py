"""The one place where policy names meet policy classes.

Built-in names map to ``module:Class`` paths imported on first use; any other name of the form
``package.module:Class`` is imported the same way (user policies). Options are validated against
the policy's ``Config`` dataclass: an unknown option is a :class:`ConfigError` naming it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import os
import random
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError, UnknownPolicyError
from sessionroute.router.policies.base import Policy

__all__ = [
    "BUILTIN_POLICIES",
    "PEER_POLICIES",
    "SESSION_POLICIES",
    "PolicyChoice",
    "choose_policy",
    "create_policy",
    "policy_class",
    "policy_names",
]

BUILTIN_POLICIES: dict[str, str] = {
    "round_robin": "sessionroute.router.policies.round_robin:RoundRobinPolicy",
    "random": "sessionroute.router.policies.random_policy:RandomPolicy",
    "power_of_two": "sessionroute.router.policies.power_of_two:PowerOfTwoPolicy",
    "least_loaded": "sessionroute.router.policies.least_loaded:LeastLoadedPolicy",
    "consistent_hash": "sessionroute.router.policies.consistent_hash:ConsistentHashPolicy",
    "sticky_least_loaded": (
        "sessionroute.router.policies.sticky_least_loaded:StickyLeastLoadedPolicy"
    ),
    "consistent_hash_bounded_load": (
        "sessionroute.router.policies.consistent_hash_bounded_load:ConsistentHashBoundedLoadPolicy"
    ),
    "cache_aware": "sessionroute.router.policies.cache_aware:CacheAwarePolicy",
    "sticky_until_saturated": (
        "sessionroute.router.policies.sticky_until_saturated:StickyUntilSaturatedPolicy"
    ),
    "cache_aware_v2": "sessionroute.router.policies.cache_aware_v2:CacheAwareV2Policy",
    "least_token_load": "sessionroute.router.policies.least_token_load:LeastTokenLoadPolicy",
    "kv_cost": "sessionroute.router.policies.kv_cost:KvCostPolicy",
    "trajectory_admission": (
        "sessionroute.router.policies.trajectory_admission:TrajectoryAdmissionPolicy"
    ),
    "adaptive_sticky": "sessionroute.router.policies.adaptive_sticky:AdaptiveStickyPolicy",
    "adaptive_hold": "sessionroute.router.policies.adaptive_hold:AdaptiveHoldPolicy",
    "kv_aware": "sessionroute.router.policies.kv_aware:KvAwarePolicy",
}
"""Registry name -> ``module:Class``."""

SESSION_POLICIES: tuple[str, ...] = (
    "consistent_hash",
    "sticky_least_loaded",
    "consistent_hash_bounded_load",
)
"""Built-in policies that route by session id (the default experiment's arms)."""

PEER_POLICIES: tuple[str, ...] = (
    "sticky_until_saturated",
    "cache_aware_v2",
    "least_token_load",
    "kv_cost",
    "trajectory_admission",
)
"""Built-in reproductions of peer routers' policies (llm-d, SGLang model gateway, Dynamo,
ThunderAgent; ``docs/policies.md``)."""


def policy_names() -> list[str]:
    """Names of the built-in policies, in registry order."""
    return list(BUILTIN_POLICIES)


def _load_module(spec: str) -> types.ModuleType:
    """The module a ``--policy`` names: a file (``path/to/file.py``, relative to the working
    directory), else a module on ``sys.path``, else ``<module path>.py`` under the working
    directory (a console script does not put it on ``sys.path`` as ``python -m`` does).

    Raises:
        ImportError: naming the module or file (its own errors propagate as they are).
    """
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        return _load_file(Path(spec))
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        local = Path.cwd() / (spec.replace(".", os.sep) + ".py")
        if exc.name != spec.split(".")[0] or not local.is_file():
            raise
        return _load_file(local)


def _load_file(path: Path) -> types.ModuleType:
    """Import the Python file ``path`` once per resolved path (under a name derived from it,
    kept in ``sys.modules`` so dataclasses and pickling find it)."""
    resolved = path.expanduser().resolve()
    if not resolved.is_file():
        raise ImportError(f"no such policy file: {str(path)!r} ({resolved})")
    digest = hashlib.sha1(str(resolved).encode(), usedforsecurity=False).hexdigest()[:12]
    name = f"sessionroute_user_policy_{resolved.stem}_{digest}"
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load policy file {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import(path: str, name: str) -> type[Policy]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise UnknownPolicyError(
            f"unknown policy {name!r}: expected one of {', '.join(BUILTIN_POLICIES)} "
            "or 'package.module:Class' or 'path/to/file.py:Class'"
        )
    try:
        module = _load_module(module_name)
    except ImportError as exc:
        raise UnknownPolicyError(f"cannot import policy module {module_name!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if cls is None:
        raise UnknownPolicyError(f"policy module {module_name!r} has no attribute {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise UnknownPolicyError(f"{path!r} is not a sessionroute.router.policies.Policy subclass")
    return cls


def policy_class(name: str) -> type[Policy]:
    """The class for a built-in name or a ``module:Class`` path.

    Raises:
        UnknownPolicyError: if the name is unknown or the path does not name a Policy subclass.
    """
    return _import(BUILTIN_POLICIES.get(name, name), name)


_SCALARS: tuple[type, ...] = (bool, int, float, str)
_TYPE_WORDS: dict[type, str] = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "a string",
    type(None): "null",
}


def _scalar_types(hint: Any) -> tuple[type, ...] | None:
    """The types an option annotated ``hint`` accepts, when it is a plain scalar or a union of
    them (``float | None``); None for anything else (left to the ``Config`` itself). An int is
    accepted where a float is (TOML and JSON write 1 for 1.0)."""
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    args = typing.get_args(hint) if union else (hint,)
    if not all(a in _SCALARS or a is type(None) for a in args):
        return None
    return tuple(args) + ((int,) if float in args and int not in args else ())


def _check_option_types(cls: type[Policy], cfg_cls: type, options: Mapping[str, Any]) -> None:
    """ConfigError naming an option whose value is not of its annotated scalar type (a
    ``--policy-option temperature=abc`` gave Python's ``'>=' not supported`` before)."""
    try:
        hints = typing.get_type_hints(cfg_cls)
    except (NameError, TypeError):  # an annotation we cannot resolve: the Config checks
        return
    for key, value in options.items():
        allowed = _scalar_types(hints.get(key))
        if allowed is None:
            continue
        ok = isinstance(value, allowed) and (not isinstance(value, bool) or bool in allowed)
        if not ok:
            # float's implied int is not named: "a number", not "a number or a whole number"
            shown = [t for t in allowed if not (t is int and float in allowed)]
            names = " or ".join(_TYPE_WORDS[t] for t in shown)
            raise ConfigError(
                f"bad options for policy {cls.name!r}: {key} must be {names}, got {value!r}"
            )


def make_config(cls: type[Policy], options: Mapping[str, Any] | None) -> Any:
    """Build ``cls.Config`` from ``options``; ConfigError names any unknown or bad option."""
    options = dict(options or {})
    cfg_cls = cls.Config
    if cfg_cls is None:
        if options:
            raise ConfigError(f"policy {cls.name!r} takes no options, got {sorted(options)}")
        return None
    if dataclasses.is_dataclass(cfg_cls):
        known = {f.name for f in dataclasses.fields(cfg_cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(
                f"unknown option(s) {unknown} for policy {cls.name!r}; known: {sorted(known)}"
            )
        _check_option_types(cls, cfg_cls, options)
    try:
        return cfg_cls(**options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bad options for policy {cls.name!r}: {exc}") from exc


def create_policy(
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    clock: Clock,
    rng: random.Random | None = None,
    seed: int = 0,
) -> Policy:
    """Instantiate a policy by registry name or ``module:Class``.

    Args:
        name: a built-in name (see :data:`BUILTIN_POLICIES`) or ``package.module:Class``.
        options: keyword options for the policy's ``Config``.
        clock: injected clock.
        rng: injected random generator; a ``random.Random(seed)`` when omitted.
        seed: seed used when ``rng`` is omitted.

    Raises:
        UnknownPolicyError: unknown name. ConfigError: unknown or invalid option.
    """
    cls = policy_class(name)
    config = make_config(cls, options)
    return cls(config, clock=clock, rng=rng if rng is not None else random.Random(seed))


@dataclass(frozen=True, slots=True)
class PolicyChoice:
    """A policy chosen and configured: its class and its validated ``Config`` instance.

    The typed form of "which policy, with which options" that the router core, the simulator
    and ``serve`` take; names exist only where users type them (CLI flags, experiment files)
    and are turned into a choice by :func:`choose_policy`.

    Attributes:
        cls: the policy class.
        config: an instance of ``cls.Config`` (None for a policy without options).
    """

    cls: type[Policy]
    config: Any = None

    @property
    def name(self) -> str:
        """The policy's registry name (``cls.name``)."""
        return self.cls.name

    def options(self) -> dict[str, Any]:
        """The options as a dict (for reports and ``config.resolved.toml``)."""
        config = self.config
        if config is None or not dataclasses.is_dataclass(config):
            return {}
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}

    def build(self, *, clock: Clock, rng: random.Random) -> Policy:
        """A new policy instance with the injected clock and random generator."""
        return self.cls(self.config, clock=clock, rng=rng)


def takes_option(cls: type[Policy], option: str) -> bool:
    """Whether ``cls.Config`` is a dataclass with a field named ``option``."""
    cfg = cls.Config
    return (
        cfg is not None
        and dataclasses.is_dataclass(cfg)
        and option in {f.name for f in dataclasses.fields(cfg)}
    )


def choose_policy(
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    session_ttl_s: float | None = None,
    session_table_max_bytes: int | None = None,
) -> PolicyChoice:
    """Resolve a policy name and its options (the CLI and TOML edge).

    Args:
        name: a built-in name (see :data:`BUILTIN_POLICIES`) or ``package.module:Class``.
        options: keyword options for the policy's ``Config``.
        session_ttl_s: the router's session TTL (``RouterConfig.session_ttl_s``), given to a
            policy whose ``Config`` has ``session_ttl_s`` unless ``options`` sets it.
        session_table_max_bytes: the router's byte cap of session tables
            (``RouterConfig.session_table_max_bytes``), given the same way.

    Raises:
        UnknownPolicyError: unknown name. ConfigError: unknown or invalid option.
    """
    cls = policy_class(name)
    opts = dict(options or {})
    if session_ttl_s is not None and takes_option(cls, "session_ttl_s"):
        opts.setdefault("session_ttl_s", session_ttl_s)
    if session_table_max_bytes is not None and takes_option(cls, "session_table_max_bytes"):
        opts.setdefault("session_table_max_bytes", session_table_max_bytes)
    return PolicyChoice(cls, make_config(cls, opts))
