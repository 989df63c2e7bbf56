"""Where the public traces live (``shared/traces/README.md``) and small parsing helpers.

The trace directory is, in order: the ``SESSIONROUTE_TRACES`` environment variable (read by
the caller and passed in, or from ``os.environ``), ``../shared/traces`` next to the repository
root, ``../shared/traces`` from the current directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sessionroute.errors import ConfigError, TraceFormatError

__all__ = [
    "MOONCAKE_CONVERSATION",
    "MOONCAKE_CONVERSATION_SESSIONS",
    "TRACES_ENV",
    "WEKA_REQUESTS",
    "parse_float",
    "parse_int",
    "resolve_trace",
    "trace_dirs",
]

TRACES_ENV = "SESSIONROUTE_TRACES"
"""Environment variable naming the trace directory."""
WEKA_REQUESTS = "weka_cc_traces_requests.csv"
MOONCAKE_CONVERSATION = "mooncake_conversation_trace.jsonl"
MOONCAKE_CONVERSATION_SESSIONS = "mooncake_conversation_sessions.csv"


def trace_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    """Candidate trace directories, most specific first."""
    environ = os.environ if env is None else env
    dirs: list[Path] = []
    if environ.get(TRACES_ENV):
        dirs.append(Path(environ[TRACES_ENV]))
    repo_root = Path(__file__).resolve().parents[3]
    dirs.append(repo_root.parent / "shared" / "traces")
    dirs.append(Path.cwd().parent / "shared" / "traces")
    return dirs


def resolve_trace(name: str, env: Mapping[str, str] | None = None) -> Path:
    """The path of trace file ``name`` (an existing path, or a file name in a trace dir).

    Raises:
        ConfigError: if it is a directory, or found nowhere (the message lists where it
            looked).
    """
    p = Path(name)
    if p.is_file():
        return p
    if p.is_dir():
        raise ConfigError(f"trace {name!r} is a directory; give the trace file inside it")
    looked = [p.resolve()]
    if not p.is_absolute():
        for d in trace_dirs(env):
            cand = d / p
            if cand.is_file():
                return cand
            if cand.resolve() not in looked:  # the same place reached two ways: listed once
                looked.append(cand.resolve())
    raise ConfigError(
        f"trace file {name!r} not found (looked at {', '.join(str(x) for x in looked)}); "
        f"give its path, or set {TRACES_ENV} to the directory holding it"
    )


def parse_int(
    value: str, path: str, line: int, field: str, *, lo: int | None = None, empty: int | None = None
) -> int:
    """``int(value)`` with its bounds checked.

    Args:
        value: the text.
        path, line, field: where it came from (for the error).
        lo: smallest allowed value.
        empty: value of an empty field; None makes an empty field an error.

    Raises:
        TraceFormatError: if the value is not an integer or below ``lo``.
    """
    if value == "" and empty is not None:
        return empty
    try:
        v = int(value)
    except ValueError:
        raise TraceFormatError(path, line, field, f"not an integer: {value!r}") from None
    if lo is not None and v < lo:
        raise TraceFormatError(path, line, field, f"must be >= {lo}, got {v}")
    return v


def parse_float(
    value: str,
    path: str,
    line: int,
    field: str,
    *,
    lo: float | None = None,
    empty: float | None = None,
) -> float:
    """``float(value)`` (finite) with its lower bound checked; see :func:`parse_int`.

    Raises:
        TraceFormatError: if the value is not a finite number or below ``lo``.
    """
    if value == "" and empty is not None:
        return empty
    try:
        v = float(value)
    except ValueError:
        raise TraceFormatError(path, line, field, f"not a number: {value!r}") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise TraceFormatError(path, line, field, f"not a finite number: {value!r}")
    if lo is not None and v < lo:
        raise TraceFormatError(path, line, field, f"must be >= {lo}, got {v}")
    return v
