"""The public traces shipped in ``sessionroute/data/traces``: the data its README lists, intact,
with the licence that travels with it, and found by name from anywhere."""

from __future__ import annotations

import gzip
import hashlib
import re

from sessionroute.workloads.traces import (
    MOONCAKE_CONVERSATION,
    MOONCAKE_CONVERSATION_SESSIONS,
    SHIPPED_TRACES,
    WEKA_REQUESTS,
    resolve_trace,
)

ROW = re.compile(r"^\| `([^`]+)` \| [^|]+ \| (?:`([0-9a-f]{64})`|[^|]+) \| `([0-9a-f]{64})` \|$")


def _listed() -> dict[str, tuple[str | None, str]]:
    """README table rows: file -> (sha256 of the file as shipped or None, of its content)."""
    text = (SHIPPED_TRACES / "README.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            rows[m[1]] = (m[2], m[3])
    return rows


def test_every_shipped_file_matches_the_checksums_its_readme_gives() -> None:
    listed = _listed()
    data = {p.name for p in SHIPPED_TRACES.iterdir() if p.is_file() and p.name != "README.md"}
    assert set(listed) == data
    for name, (packed_sha, content_sha) in listed.items():
        raw = (SHIPPED_TRACES / name).read_bytes()
        if packed_sha is not None:
            assert hashlib.sha256(raw).hexdigest() == packed_sha, name
        content = gzip.decompress(raw) if name.endswith(".gz") else raw
        assert hashlib.sha256(content).hexdigest() == content_sha, name


def test_the_licence_travels_with_the_data() -> None:
    licence = SHIPPED_TRACES / "LICENSES" / "Apache-2.0.txt"
    assert "Apache License" in licence.read_text(encoding="utf-8")


def test_the_examples_trace_names_resolve_to_the_shipped_files() -> None:
    for name in (WEKA_REQUESTS, MOONCAKE_CONVERSATION, MOONCAKE_CONVERSATION_SESSIONS):
        found = resolve_trace(name, env={})
        assert found == SHIPPED_TRACES / f"{name}.gz"
