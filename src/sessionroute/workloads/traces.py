"""Where the public traces live, how they are opened, and small parsing helpers.

The traces the examples replay ship with the package, gzip-compressed, in
``sessionroute/data/traces/`` (its ``README.md`` gives their sources, licences and checksums).
A trace name is looked up in, in order: the directory named by the ``SESSIONROUTE_TRACES``
environment variable (read by the caller and passed in, or from ``os.environ``), then that
bundled directory; in each, ``NAME`` and then ``NAME.gz``. :func:`open_trace` reads a gzip file
(recognised by its magic bytes, whatever its name) or a plain one alike.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from sessionroute.errors import ConfigError, TraceFormatError

__all__ = [
    "MOONCAKE_CONVERSATION",
    "MOONCAKE_CONVERSATION_SESSIONS",
    "SHIPPED_TRACES",
    "TRACES_ENV",
    "WEKA_REQUESTS",
    "open_trace",
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
SHIPPED_TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"
"""The package's own copy of the public traces (gzip files; ``README.md`` there)."""
_GZIP_MAGIC = b"\x1f\x8b"


def trace_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    """Candidate trace directories, most specific first: ``$SESSIONROUTE_TRACES``, then
    :data:`SHIPPED_TRACES`."""
    environ = os.environ if env is None else env
    dirs: list[Path] = []
    if environ.get(TRACES_ENV):
        dirs.append(Path(environ[TRACES_ENV]))
    dirs.append(SHIPPED_TRACES)
    return dirs


def _file(path: Path) -> Path | None:
    """``path`` or, failing that, ``path.gz``, whichever is a file first; else None."""
    for cand in (path, path.with_name(path.name + ".gz")):
        if cand.is_file():
            return cand
    return None


def resolve_trace(name: str, env: Mapping[str, str] | None = None) -> Path:
    """The path of trace file ``name``: an existing path, or a file name in a trace directory
    (:func:`trace_dirs`); ``NAME.gz`` is accepted wherever ``NAME`` is missing.

    Raises:
        ConfigError: if it is a directory, or found nowhere (the message lists where it
            looked).
    """
    p = Path(name)
    if p.is_dir():
        raise ConfigError(f"trace {name!r} is a directory; give the trace file inside it")
    found = _file(p)
    if found is not None:
        return found
    looked = [p.resolve()]
    if not p.is_absolute():
        for d in trace_dirs(env):
            cand = d / p
            found = _file(cand)
            if found is not None:
                return found
            if cand.resolve() not in looked:  # the same place reached two ways: listed once
                looked.append(cand.resolve())
    raise ConfigError(
        f"trace file {name!r} not found (looked at {', '.join(str(x) for x in looked)}); "
        f"give its path, or set {TRACES_ENV} to the directory holding it"
    )


def open_trace(path: str | Path) -> TextIO:
    """Open a trace file for reading as UTF-8 text, decompressing it if it is gzip.

    Newlines are passed through untranslated (as ``open(..., newline="")``), which both the CSV
    and the JSONL readers accept.

    Raises:
        OSError: if the file cannot be read (``gzip.BadGzipFile`` for a corrupt gzip file).
    """
    with open(path, "rb") as probe:
        compressed = probe.read(2) == _GZIP_MAGIC
    if compressed:
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


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
