"""Loader of the Weka / kv-cache-tester Claude Code trace (``weka_cc_traces_requests.csv[.gz]``).

One row per LLM call (``sessionroute/data/traces/README.md`` and the ``.meta.json`` legend):
``row, session, agent, turn, t, input_tokens, output_tokens, cached_tokens, match_row,
api_time, think_time, model, stop``. Every field is validated; a malformed row raises
:class:`~sessionroute.errors.TraceFormatError` with the file, the 1-based line and the field.
``api_time`` and ``think_time`` may be empty (not recorded); they load as None.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from sessionroute.errors import TraceFormatError
from sessionroute.keys import chain_key
from sessionroute.workloads.content import SHARED_NAMESPACE
from sessionroute.workloads.traces import open_trace, parse_float, parse_int

__all__ = ["WEKA_BLOCK", "WEKA_COLUMNS", "WekaKeys", "WekaRow", "WekaTrace", "load_weka"]

WEKA_BLOCK = 64
"""Tokens per block of the original hash ids (``source_block_size_tokens``)."""

WEKA_COLUMNS: tuple[str, ...] = (
    "row",
    "session",
    "agent",
    "turn",
    "t",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "match_row",
    "api_time",
    "think_time",
    "model",
    "stop",
)


@dataclass(frozen=True, slots=True)
class WekaRow:
    """One LLM call (tokens, seconds). See the module docstring for the fields."""

    row: int
    session: int
    agent: int
    turn: int
    t: float
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    match_row: int
    api_time: float | None
    think_time: float | None
    model: int
    stop: str


@dataclass(slots=True)
class WekaTrace:
    """A loaded trace.

    Attributes:
        path: the file.
        rows: every row, indexed by ``row``.
        sessions: session id -> its row indices in file order.
    """

    path: str
    rows: list[WekaRow]
    sessions: dict[int, list[int]] = field(default_factory=dict)


_INT_LO = (
    ("row", 0),
    ("session", 0),
    ("agent", 0),
    ("turn", 0),
    ("input_tokens", 1),
    ("output_tokens", 0),
    ("cached_tokens", 0),
    ("match_row", -1),
    ("model", 0),
)


def _row_fast(rec: list[str], idx: dict[str, int]) -> WekaRow | None:
    """The row when every field is well formed, else None (then :func:`_row` names the fault)."""
    try:
        ints = [int(rec[idx[name]]) for name, _ in _INT_LO]
        api, think = rec[idx["api_time"]], rec[idx["think_time"]]
        t = float(rec[idx["t"]])
        a = None if api == "" else float(api)
        th = None if think == "" else float(think)
    except ValueError:
        return None
    if any(v < lo for v, (_, lo) in zip(ints, _INT_LO, strict=True)):
        return None
    for v in (t, a, th):
        if v is not None and not 0.0 <= v < float("inf"):  # also refuses nan
            return None
    return WekaRow(
        ints[0], ints[1], ints[2], ints[3], t, ints[4], ints[5], ints[6], ints[7], a, th,
        ints[8], rec[idx["stop"]],
    )  # fmt: skip


def _row(rec: list[str], idx: dict[str, int], path: str, line: int) -> WekaRow:
    fast = _row_fast(rec, idx)
    if fast is not None:
        return fast

    def i(name: str, lo: int | None = None, empty: int | None = None) -> int:
        return parse_int(rec[idx[name]], path, line, name, lo=lo, empty=empty)

    def f(name: str, empty: float | None = None) -> float:
        return parse_float(rec[idx[name]], path, line, name, lo=0.0, empty=empty)

    api = rec[idx["api_time"]]
    think = rec[idx["think_time"]]
    return WekaRow(
        row=i("row", 0),
        session=i("session", 0),
        agent=i("agent", 0),
        turn=i("turn", 0),
        t=f("t"),
        input_tokens=i("input_tokens", 1),
        output_tokens=i("output_tokens", 0),
        cached_tokens=i("cached_tokens", 0),
        match_row=i("match_row", -1),
        api_time=None if api == "" else f("api_time"),
        think_time=None if think == "" else f("think_time"),
        model=i("model", 0),
        stop=rec[idx["stop"]],
    )


def _check_links(r: WekaRow, rows: list[WekaRow], path: str, line: int) -> None:
    if r.cached_tokens % WEKA_BLOCK:
        raise TraceFormatError(
            path, line, "cached_tokens", f"{r.cached_tokens} is not a multiple of {WEKA_BLOCK}"
        )
    if r.cached_tokens > r.input_tokens:
        raise TraceFormatError(
            path, line, "cached_tokens", f"{r.cached_tokens} exceeds input_tokens {r.input_tokens}"
        )
    m = r.match_row
    if m == -1:
        if r.cached_tokens:
            raise TraceFormatError(
                path, line, "match_row", f"-1 but cached_tokens is {r.cached_tokens}"
            )
        return
    if m >= r.row:
        raise TraceFormatError(path, line, "match_row", f"{m} is not an earlier row than {r.row}")
    parent = rows[m]
    if parent.session != r.session:
        raise TraceFormatError(
            path, line, "match_row", f"row {m} is in session {parent.session}, not {r.session}"
        )
    full = parent.input_tokens // WEKA_BLOCK * WEKA_BLOCK
    if r.cached_tokens > full:
        raise TraceFormatError(
            path,
            line,
            "cached_tokens",
            f"{r.cached_tokens} exceeds the {full} full-block tokens of match_row {m}",
        )


def load_weka(path: str | Path) -> WekaTrace:
    """Read and validate a Weka requests CSV.

    Raises:
        TraceFormatError: for a missing column, a row with the wrong number of fields, a bad
            value, a ``row`` out of sequence, an inconsistent ``cached_tokens``/``match_row``,
            or a ``t`` before that of the session's previous row.
        OSError: if the file cannot be read.
    """
    p = str(path)
    rows: list[WekaRow] = []
    sessions: dict[int, list[int]] = {}
    with open_trace(p) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(p, 1, "header", "empty file")
        idx = {name.strip(): k for k, name in enumerate(header)}
        for col in WEKA_COLUMNS:
            if col not in idx:
                raise TraceFormatError(p, 1, col, "missing column")
        width = len(header)
        for rec in reader:
            line = reader.line_num
            if not rec:
                continue
            if len(rec) != width:
                raise TraceFormatError(p, line, "row", f"{len(rec)} fields, header has {width}")
            r = _row(rec, idx, p, line)
            if r.row != len(rows):
                raise TraceFormatError(p, line, "row", f"expected {len(rows)}, got {r.row}")
            _check_links(r, rows, p, line)
            earlier = sessions.setdefault(r.session, [])
            if earlier and r.t < rows[earlier[-1]].t:
                raise TraceFormatError(
                    p,
                    line,
                    "t",
                    f"{r.t:g} is before {rows[earlier[-1]].t:g}, the time of the session's "
                    f"previous row ({earlier[-1]}): timestamps may not go backwards",
                )
            rows.append(r)
            earlier.append(r.row)
    if not rows:
        raise TraceFormatError(p, 2, "row", "no data rows")
    return WekaTrace(p, rows, sessions)


class WekaKeys:
    """Prompt block keys of each row at a replica block size, rebuilt from the prefix tree.

    ``blocks(r) = blocks(match_row)[:cached_tokens / 64] + fresh blocks`` (the traces' README):
    a replica block ending at token ``e`` is keyed by the 64-token trace block holding token
    ``e - 1`` - inherited from ``match_row`` when that block is within ``cached_tokens``, else
    fresh to the row (``chain_key(-7, row, (e - 1) // 64, e)``, :mod:`sessionroute.keys`).
    Blocks ending within the first ``shared_prefix_tokens`` get a key common to every session
    (``chain_key(SHARED_NAMESPACE, e)``, as in
    :func:`~sessionroute.workloads.content.expand_trace_blocks`).

    Each row's keys are meant to be asked for once (its send); a row's keys are kept until the
    row and every row matching it have been built, then dropped.

    Args:
        trace: the loaded trace.
        block_size: the replica's block size in tokens.
        shared_prefix_tokens: globally shared leading tokens (0: none).
    """

    __slots__ = ("_bs", "_keys", "_refs", "_shared", "trace")

    def __init__(self, trace: WekaTrace, block_size: int, shared_prefix_tokens: int = 0) -> None:
        self.trace = trace
        self._bs = block_size
        self._shared = shared_prefix_tokens
        self._keys: dict[int, list[int]] = {}
        self._refs = [1] * len(trace.rows)  # the row's own use plus one per matching row
        for r in trace.rows:
            if r.match_row >= 0:
                self._refs[r.match_row] += 1

    def _key(self, row: int, e: int) -> int:
        if e <= self._shared:
            return chain_key(SHARED_NAMESPACE, e)
        return chain_key(-7, row, (e - 1) // WEKA_BLOCK, e)

    def keys(self, row: int) -> list[int]:
        """Keys of the ``input_tokens // block_size`` full prompt blocks of ``row``."""
        got = self._keys.get(row)
        if got is None:
            rows = self.trace.rows
            chain = [row]
            while True:
                m = rows[chain[-1]].match_row
                if m < 0 or m in self._keys:
                    break
                chain.append(m)
            bs = self._bs
            for i in reversed(chain):
                r = rows[i]
                if r.match_row >= 0:
                    base = self._keys[r.match_row]
                    k0 = min(r.cached_tokens // bs, len(base))
                    out = base[:k0]
                    self._release(r.match_row)
                else:
                    out, k0 = [], 0
                out.extend(self._key(i, (j + 1) * bs) for j in range(k0, r.input_tokens // bs))
                self._keys[i] = out
            got = self._keys[row]
        self._release(row)
        return got

    def _release(self, row: int) -> None:
        self._refs[row] -= 1
        if self._refs[row] <= 0:
            self._keys.pop(row, None)
