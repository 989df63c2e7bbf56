"""The README and docs say what runs: every code block marked ``<!-- runnable -->`` runs as
written (Python with the installed package, shell with ``sessionroute`` on PATH, from the
repository root), every relative link points at a file and heading that exist, and the README
stays short."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sessionroute

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- runnable -->"
BLOCK = re.compile(re.escape(MARK) + r"\n```(python|bash)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
README_MAX_LINES = 150


def _blocks() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert text.count(MARK) == len(BLOCK.findall(text)), f"{page.name}: a mark without a block"
        for n, (lang, code) in enumerate(BLOCK.findall(text), start=1):
            found.append((f"{page.relative_to(ROOT)}#{n}-{lang}", lang, code))
    return found


BLOCKS = _blocks()


def test_the_readme_is_short_and_shows_runnable_code() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    langs = {lang for name, lang, _ in BLOCKS if name.startswith("README.md")}
    assert langs == {"python", "bash"}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a snippet: this package importable, ``sessionroute`` on PATH."""
    bin_dir = tmp_path_factory.mktemp("bin")
    shim = bin_dir / "sessionroute"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sessionroute.cli "$@"\n')
    shim.chmod(0o755)
    src = str(Path(sessionroute.__file__).resolve().parents[1])
    path = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join(p for p in [src, os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PATH": path, "PYTHONPATH": pythonpath, "COLUMNS": "100"}


@pytest.mark.slow
@pytest.mark.parametrize(("name", "lang", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_a_runnable_block_runs(name: str, lang: str, code: str, env: dict[str, str]) -> None:
    if lang == "python":
        argv = [sys.executable, "-c", code]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", code]
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def _python_blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text[: m.start()].count("\n") + 2
            found.append((f"{page.relative_to(ROOT)}:{line}", m[1]))
    return found


PYTHON_BLOCKS = _python_blocks()


@pytest.mark.parametrize(("where", "code"), PYTHON_BLOCKS, ids=[w for w, _ in PYTHON_BLOCKS])
def test_every_python_block_is_valid_python(where: str, code: str) -> None:
    """Blocks that are not run (they need servers) still compile as a script would."""
    compile(code, where, "exec")


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        missing_heading = anchor and dest.suffix == ".md" and anchor not in _anchors(dest)
        if not dest.exists() or missing_heading:
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"
