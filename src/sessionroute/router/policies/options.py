"""Policy options as users write them, and the knobs a tuner may turn.

Three written forms name a policy with options, all read here:

* ``name(key=value, ...)`` on the command line (``compare --policies``, ``sweep --policies``,
  ``serve --policy``), e.g. ``consistent_hash_bounded_load(c=1.05)``. Values are TOML scalars
  (``1.05``, ``12``, ``true``, ``"text"``); a bare word that is not one is taken as a string.
* a policy file (``serve --policy-config FILE``, ``compare --policies @FILE``), the TOML that
  ``sessionroute tune`` writes::

      policy = "consistent_hash_bounded_load"
      [options]
      c = 1.05

* an experiment file's ``[[arms]]`` (``policy`` and ``policy_options``).

A policy declares which of its options may be tuned, with their ranges and defaults, on the
fields of its ``Config`` dataclass (:func:`knob`), so that ``--help``, the docs and the tuner read
one declaration (:func:`knobs`).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionroute.errors import ConfigError
from sessionroute.router.policies.base import Policy

__all__ = [
    "Knob",
    "format_policy",
    "knob",
    "knobs",
    "load_policy_file",
    "parse_policy",
    "policy_file_text",
    "split_policies",
]


@dataclass(frozen=True, slots=True)
class Knob:
    """A tunable option's search range (inclusive).

    Attributes:
        low: smallest value searched.
        high: largest value searched.
        log: search on a log scale (for ranges spanning decades).
        integer: whole numbers only.
        default: the option's default (filled in by :func:`knobs` from the field).
    """

    low: float
    high: float
    log: bool = False
    integer: bool = False
    default: Any = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ConfigError(f"a knob's range must be finite with low < high, got {self}")
        if self.log and self.low <= 0:
            raise ConfigError(f"a log-scale knob needs low > 0, got {self.low}")

    def describe(self) -> str:
        """E.g. ``"1.0 .. 2.0 (default 1.25)"``, ``"1 .. 256, log (default 64)"``."""
        low, high = (
            (str(int(self.low)), str(int(self.high)))
            if self.integer
            else (f"{self.low:g}", f"{self.high:g}")
        )
        scale = ", log" if self.log else ""
        return f"{low} .. {high}{scale} (default {self.default!r})"


_KNOB = "sessionroute.knob"


def knob(default: Any, low: float, high: float, *, log: bool = False) -> Any:
    """A ``Config`` field with a default and a tuning range: ``c: float = knob(1.25, 1.0, 2.0)``.

    The range must hold the default; an ``int`` default makes an integer knob.

    Raises:
        ConfigError: for an empty range or a default outside it.
    """
    spec = Knob(low, high, log=log, integer=isinstance(default, int), default=default)
    if not low <= default <= high:
        raise ConfigError(f"knob default {default!r} is outside its range {low}..{high}")
    return dataclasses.field(default=default, metadata={_KNOB: spec})


def knobs(cls: type[Policy]) -> dict[str, Knob]:
    """The tunable options of a policy class, by option name, in field order (empty when the
    policy declares none)."""
    cfg = cls.Config
    if cfg is None or not dataclasses.is_dataclass(cfg):
        return {}
    return {f.name: f.metadata[_KNOB] for f in dataclasses.fields(cfg) if _KNOB in f.metadata}


def split_policies(text: str) -> list[str]:
    """``a,b(x=1,y=2),c`` -> ``["a", "b(x=1,y=2)", "c"]``: split at commas outside parentheses
    and ``"strings"``.

    Raises:
        ConfigError: for unbalanced parentheses or an empty list.
    """
    parts: list[str] = []
    depth = 0
    quoted = escaped = False
    current: list[str] = []
    for ch in text:
        if quoted:  # inside a "string": only its end matters
            escaped, quoted = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            quoted = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"unbalanced ')' in policy list {text!r}")
        if ch == "," and depth == 0 and not quoted:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if depth:
        raise ConfigError(f"unbalanced '(' in policy list {text!r}")
    parts.append("".join(current).strip())
    names = [p for p in parts if p]
    if not names:
        raise ConfigError(f"no policy named in {text!r}")
    return names


def _value(raw: str, where: str) -> Any:
    """A TOML scalar, or the bare word as a string."""
    raw = raw.strip()
    if not raw:
        raise ConfigError(f"empty value in {where}")
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if any(c in raw for c in "\"'[]{}=,"):
            raise ConfigError(f"cannot read value {raw!r} in {where}") from None
        return raw


def parse_policy(text: str) -> tuple[str, dict[str, Any]]:
    """``"name(key=value, ...)"`` -> ``("name", {"key": value})``; a plain name has no options.

    Raises:
        ConfigError: naming the text, for a missing ``)``, an option without ``=``, an empty
            key, a repeated key or an unreadable value.
    """
    text = text.strip()
    name, paren, rest = text.partition("(")
    name = name.strip()
    if not name:
        raise ConfigError(f"no policy name in {text!r}")
    if not paren:
        return name, {}
    if not rest.endswith(")"):
        raise ConfigError(f"policy {text!r}: options must end with ')'")
    body = rest[:-1]
    options: dict[str, Any] = {}
    for item in split_policies(body) if body.strip() else []:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"policy {text!r}: option {item!r} must be key=value")
        if key in options:
            raise ConfigError(f"policy {text!r}: option {key!r} given twice")
        options[key] = _value(raw, f"policy {text!r}")
    return name, options


def format_policy(name: str, options: Mapping[str, Any]) -> str:
    """The inverse of :func:`parse_policy`: ``name(key=value, ...)``, or ``name`` alone."""
    if not options:
        return name
    shown = []
    for key, value in options.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        else:
            text = repr(value)
        shown.append(f"{key}={text}")
    return f"{name}({', '.join(shown)})"


def load_policy_file(path: str | Path) -> tuple[str, dict[str, Any]]:
    """Read a policy file (module docstring): its policy name and options.

    Raises:
        ConfigError: naming the file, when it is missing, is not TOML, has no ``policy`` string,
            has ``options`` that are not a table, or has keys other than ``policy``, ``options``
            and ``meta``.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"policy file {str(p)!r} not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"policy file {str(p)!r}: {exc}") from None
    unknown = sorted(set(data) - {"policy", "options", "meta"})
    if unknown:
        raise ConfigError(
            f"policy file {str(p)!r}: unknown key(s) {unknown}; expected policy, options, meta"
        )
    name = data.get("policy")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"policy file {str(p)!r}: 'policy' must be a policy name")
    options = data.get("options", {})
    if not isinstance(options, dict):
        raise ConfigError(f"policy file {str(p)!r}: 'options' must be a table")
    return name, dict(options)


def policy_file_text(
    name: str, options: Mapping[str, Any], meta: Mapping[str, Any] | None = None
) -> str:
    """The TOML of a policy file that :func:`load_policy_file` reads back to ``(name,
    options)``; ``meta`` (e.g. the objective and spread a tuner measured) is kept under
    ``[meta]`` and ignored by readers."""
    import tomli_w

    data: dict[str, Any] = {"policy": name, "options": dict(options)}
    if meta:
        data["meta"] = dict(meta)
    return tomli_w.dumps(data)
