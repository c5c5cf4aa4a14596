"""The docs site builds with ``--strict`` (a broken link or reference fails), and its API
reference has every public name of ``palaestra`` with its signature."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

import palaestra as pa

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")
REPO = Path(__file__).resolve().parent.parent
LAZY = ("LocalClient", "LocalStats", "MCPEnv", "MCPServer", "MCPConnectionError", "MCPToolError")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return out


def reference_text(site: Path) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted((site / "reference").rglob("*.html")))


def test_every_public_name_has_an_entry(site: Path) -> None:
    ids = set(re.findall(r'id="(palaestra[\w.]*)"', reference_text(site)))
    names = [n for n in pa.__all__ if n != "__version__"] + list(LAZY)
    missing = [n for n in names if not any(i == f"palaestra.{n}" or i.endswith(f".{n}") for i in ids)]
    assert not missing, f"not in the API reference: {missing}"


def test_entries_show_constructor_parameters_and_defaults(site: Path) -> None:
    text = html.unescape(re.sub(r"<[^>]+>", "", reference_text(site)))
    for signature in ("rollouts_per_example: int = 1", "max_turns: int = 10", "pass_threshold: float = 0.5"):
        assert signature in text, signature


def test_the_guides_and_the_changelog_are_pages(site: Path) -> None:
    for page in ("concepts", "environments", "hub", "releasing", "changelog"):
        assert (site / page / "index.html").is_file(), page
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "An environment in a few lines" in home  # the README is the home page
    assert pa.__version__ in (site / "changelog" / "index.html").read_text(encoding="utf-8")
