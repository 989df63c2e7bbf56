"""``sessionroute policies``: what a newcomer reads first about the policies."""

from __future__ import annotations

import pytest

from sessionroute.cli import main
from sessionroute.router.policies.registry import policy_names


def test_the_list_shows_every_name_whole_and_no_markup(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an 80-column terminal each policy's name stands whole on its row (a name cut to
    ``consistent_hash_bounde…`` cannot be copied into ``--policy``), and the docstrings'
    reStructuredText backquotes are not shown."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    first_cells = {line.split("│")[1].strip() for line in out.splitlines() if "│" in line}
    assert set(policy_names()) <= first_cells
    assert "…" not in out and "``" not in out
