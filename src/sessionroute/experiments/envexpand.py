"""``${VAR}`` and ``${VAR:-default}`` expansion of strings in experiment files."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sessionroute.errors import ConfigError

__all__ = ["expand_env"]

_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def _expand_str(value: str, env: Mapping[str, str], where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env and env[name] != "":
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: environment variable {name!r} is not set and has no default")

    return _PATTERN.sub(sub, value)


def expand_env(data: Any, env: Mapping[str, str], where: str = "") -> Any:
    """Recursively expand ``${VAR}`` / ``${VAR:-default}`` in every string of ``data``.

    Args:
        data: parsed TOML (dicts, lists, scalars).
        env: the environment (usually ``os.environ``).
        where: dotted key path for error messages.

    Raises:
        ConfigError: naming the key and the variable when a variable is unset without default.
    """
    if isinstance(data, str):
        return _expand_str(data, env, where or "<root>")
    if isinstance(data, dict):
        return {k: expand_env(v, env, f"{where}.{k}" if where else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [expand_env(v, env, f"{where}[{i}]") for i, v in enumerate(data)]
    return data
