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


def test_a_policys_options_show_what_it_runs_with_under_an_objective(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``adaptive_hold`` runs with other options under a serving objective (short_place
    ``"cache_aware_v2"``, not its default ``"load"``): its table says so in a column, where
    a newcomer reading the defaults would otherwise take ``"load"`` for what a trace replay
    runs."""
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["policies", "adaptive_hold"]) == 0
    out = capsys.readouterr().out
    assert "under serving" in out
    rows = {
        cells[0]: cells[1:]
        for line in out.splitlines()
        if "│" in line and len(cells := [c.strip() for c in line.split("│")[1:-1]]) == 4
    }
    assert rows["short_place"][:2] == ["'load'", "'cache_aware_v2'"]
    assert rows["hold_kv"][1] == ""
    assert main(["policies", "cache_aware_v2"]) == 0
    assert "under" not in capsys.readouterr().out
