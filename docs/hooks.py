"""MkDocs hooks for the docs site: the README as the home page, the changelog, links out of docs/.

The guides link to files outside ``docs/`` (an environment's README, the tic-tac-toe recipe):
on GitHub those links work, on the site they would point nowhere, so they become the file's path
in the source tree, in code type. Every other link is checked by ``mkdocs build --strict``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# a Markdown link whose target climbs out of docs/: [text](../path)
_OUTSIDE = re.compile(r"\[([^\]]+)\]\(\.\./([^)#\s]+)(#[^)\s]*)?\)")
# the README's links into docs/, written from the repository's root
_INTO_DOCS = re.compile(r"\]\(docs/")
# the README's other relative links (environments/, examples/, benchmarks/)
_README_OUTSIDE = re.compile(r"\[([^\]]+)\]\(((?:environments|examples|benchmarks)/[^)#\s]+)(#[^)\s]*)?\)")


def _generated(files: Any, config: Any, src_uri: str, content: str) -> None:
    from mkdocs.structure.files import File

    files.append(File.generated(config, src_uri, content=content))


def on_files(files: Any, config: Any) -> Any:
    """The README (as ``index.md``) and ``CHANGELOG.md`` (as ``changelog.md``) join the site."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    readme = _INTO_DOCS.sub("](", readme)
    readme = _README_OUTSIDE.sub(lambda m: f"{m.group(1)} (`{m.group(2)}`)", readme)
    _generated(files, config, "index.md", readme)
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").replace("](docs/", "](")
    _generated(files, config, "changelog.md", changelog)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """A link out of ``docs/`` becomes its text and the file's path in the source tree."""
    return _OUTSIDE.sub(lambda m: f"{m.group(1)} (`{m.group(2)}` in the source tree)", markdown)
