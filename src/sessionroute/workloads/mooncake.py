"""Loader of the Mooncake FAST'25 traces (JSONL) and their reconstructed sessions (CSV).

Plain or gzip files (``sessionroute/data/traces/README.md``). Trace lines: ``{"timestamp": ms,
"input_length": tokens, "output_length": tokens, "hash_ids": [...]}`` sorted by arrival, one id
per 512-token block (``len == ceil(input_length / 512)``, the last one covering a partial
block). Session rows: ``row, session, turn, parent_row, reused_blocks_any,
reused_blocks_parent``. Every field is validated; a malformed line raises
:class:`~sessionroute.errors.TraceFormatError` with the file, the 1-based line and the field.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionroute.errors import TraceFormatError
from sessionroute.workloads.traces import open_trace, parse_int

__all__ = [
    "MOONCAKE_BLOCK",
    "MooncakeRequest",
    "MooncakeTrace",
    "load_mooncake",
    "load_mooncake_sessions",
]

MOONCAKE_BLOCK = 512
"""Tokens per block of ``hash_ids``."""


@dataclass(frozen=True, slots=True)
class MooncakeRequest:
    """One request: arrival (ms since trace start), lengths (tokens), chained block ids."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(slots=True)
class MooncakeTrace:
    """A loaded trace.

    Attributes:
        path: the JSONL file.
        requests: requests in file order.
        sessions: per request, its session id (None without a sessions file).
    """

    path: str
    requests: list[MooncakeRequest]
    sessions: list[int] | None = None


def _int_field(obj: dict[str, Any], key: str, path: str, line: int, lo: int) -> int:
    if key not in obj:
        raise TraceFormatError(path, line, key, "missing")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceFormatError(path, line, key, f"not an integer: {v!r}")
    if v < lo:
        raise TraceFormatError(path, line, key, f"must be >= {lo}, got {v}")
    return v


def _request(obj: Any, path: str, line: int) -> MooncakeRequest:
    if not isinstance(obj, dict):
        raise TraceFormatError(path, line, "<line>", "not a JSON object")
    ts = obj.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not ts >= 0:
        raise TraceFormatError(path, line, "timestamp", f"not a number >= 0: {ts!r}")
    n_in = _int_field(obj, "input_length", path, line, 1)
    n_out = _int_field(obj, "output_length", path, line, 0)
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in ids
    ):
        raise TraceFormatError(path, line, "hash_ids", "not a list of integers")
    want = -(-n_in // MOONCAKE_BLOCK)
    if len(ids) != want:
        raise TraceFormatError(
            path,
            line,
            "hash_ids",
            f"{len(ids)} ids for input_length {n_in} (expected ceil({n_in}/512) = {want})",
        )
    return MooncakeRequest(float(ts), n_in, n_out, tuple(ids))


def load_mooncake(path: str | Path) -> MooncakeTrace:
    """Read and validate a Mooncake JSONL trace (blank lines are ignored).

    Raises:
        TraceFormatError: invalid JSON, a missing or bad field, or timestamps going backwards.
        OSError: if the file cannot be read.
    """
    p = str(path)
    reqs: list[MooncakeRequest] = []
    last = 0.0
    with open_trace(p) as fh:
        for line_no, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(p, line_no, "<line>", f"invalid JSON: {exc.msg}") from None
            r = _request(obj, p, line_no)
            if r.timestamp_ms < last:
                raise TraceFormatError(
                    p, line_no, "timestamp", f"{r.timestamp_ms} is before the previous {last}"
                )
            last = r.timestamp_ms
            reqs.append(r)
    if not reqs:
        raise TraceFormatError(p, 1, "<line>", "no requests")
    return MooncakeTrace(p, reqs)


def load_mooncake_sessions(path: str | Path, n_requests: int) -> list[int]:
    """Read a reconstructed-sessions CSV; returns the session id of each request row.

    Raises:
        TraceFormatError: a missing column, a bad value, ``row`` out of sequence, a
            ``parent_row`` that is not an earlier row of the same session, or a row count
            different from the trace's ``n_requests``.
        OSError: if the file cannot be read.
    """
    p = str(path)
    sessions: list[int] = []
    with open_trace(p) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(p, 1, "header", "empty file")
        idx = {name.strip(): k for k, name in enumerate(header)}
        for col in ("row", "session", "turn", "parent_row"):
            if col not in idx:
                raise TraceFormatError(p, 1, col, "missing column")
        for rec in reader:
            line = reader.line_num
            if not rec:
                continue
            if len(rec) != len(header):
                raise TraceFormatError(
                    p, line, "row", f"{len(rec)} fields, header has {len(header)}"
                )
            row = parse_int(rec[idx["row"]], p, line, "row", lo=0)
            if row != len(sessions):
                raise TraceFormatError(p, line, "row", f"expected {len(sessions)}, got {row}")
            sess = parse_int(rec[idx["session"]], p, line, "session", lo=0)
            parse_int(rec[idx["turn"]], p, line, "turn", lo=1)
            parent = parse_int(rec[idx["parent_row"]], p, line, "parent_row", lo=-1)
            if parent >= row:
                raise TraceFormatError(p, line, "parent_row", f"{parent} is not before row {row}")
            if parent >= 0 and sessions[parent] != sess:
                raise TraceFormatError(
                    p, line, "parent_row", f"row {parent} is in session {sessions[parent]}"
                )
            sessions.append(sess)
    if len(sessions) != n_requests:
        raise TraceFormatError(
            p,
            len(sessions) + 2,
            "row",
            f"{len(sessions)} rows but the trace has {n_requests} (a sessions file fits only "
            'its own trace; sessions_path = "" replays one session per request)',
        )
    return sessions
