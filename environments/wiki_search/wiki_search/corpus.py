"""The corpus: the Python language reference topics that ship with CPython, as pages and sections.

``pydoc_data.topics.topics`` (the text behind ``help("assert")``, generated from the reference
manual by Sphinx's text builder) maps 79 topic keys to plain-text pages. Its wording, and so the
dataset's answers and section ids, changes between Python releases, so the environment reads a
snapshot of it taken from one release (``data/pydoc_topics.json``, see ``SNAPSHOT_PYTHON``) rather
than the running interpreter's copy. ``python -m wiki_search.corpus`` rewrites the snapshot from the
running interpreter (the dataset test then says which answers moved).

A page is a topic (``page_id`` = the topic key). Its sections are the text between the headings
(a title line underlined with ``*``, ``=``, ``-`` or ``~``, one level each); a heading with no text
of its own before the next one is not a section (its title stays in its children's ``path``). A
section longer than ``MAX_SECTION_CHARS`` is cut at paragraph breaks into parts of at most that
size (a single longer paragraph stays whole, with a short one before it). A section's id is ``page_id:slug``, the slug made
from its title (``compound:the-try-statement``), ``-part-N`` added to the parts of a long one and
``-2``, ``-3`` to repeated titles in a page (before any ``-part-N``), so ids stay the same when other sections change.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SNAPSHOT = Path(__file__).parent / "data" / "pydoc_topics.json"
SNAPSHOT_PYTHON = "3.11.7"  # the release the snapshot was taken from (checked when it is loaded)
MAX_SECTION_CHARS = 3000
UNDERLINES = "*=-~"  # heading levels 0 (the page title) to 3


@dataclass(frozen=True)
class Section:
    """One section: ``id`` (``page_id:slug``), its ``title`` (its ``heading``, with "(part k of n)"
    for a part of a long one), the ``path`` of headings above it (the page title first), its
    ``level`` (1 for the page's own text, 2 and more below) and ``text``."""

    id: str
    page_id: str
    title: str
    heading: str
    path: tuple[str, ...]
    level: int
    text: str


@dataclass(frozen=True)
class Page:
    """One topic: its ``id`` (the topic key), ``title`` (its first heading) and ``sections`` in order."""

    id: str
    title: str
    sections: tuple[Section, ...]


def slugify(title: str) -> str:
    """``'The "try" statement'`` → ``'the-try-statement'``; underscores are kept (``__slots__``)."""
    return re.sub(r"[^a-z0-9_]+", "-", title.lower()).strip("-") or "section"


def _headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(line index, level, title) of each heading: an unindented line underlined to its length."""
    found = []
    for i in range(len(lines) - 1):
        title, under = lines[i], lines[i + 1]
        if (
            title.strip()
            and not title[0].isspace()
            and len(under) == len(title)
            and len(set(under)) == 1
            and under[0] in UNDERLINES
        ):
            found.append((i, UNDERLINES.index(under[0]), title.strip()))
    return found


def _parts(text: str, limit: int) -> list[str]:
    """``text`` cut at blank lines into pieces of at most ``limit`` characters where possible."""
    if len(text) <= limit:
        return [text]
    paragraphs = re.split(r"\n\s*\n", text)
    parts: list[str] = []
    current = ""
    for paragraph in paragraphs:
        joined = f"{current}\n\n{paragraph}" if current else paragraph
        if current and len(joined) > limit and len(current) >= limit // 4:
            parts.append(current)
            current = paragraph
        else:
            current = joined
    if current:
        parts.append(current)
    return parts


def split_page(page_id: str, text: str, *, max_chars: int = MAX_SECTION_CHARS) -> Page:
    """A topic's text as a ``Page`` of sections (see the module docstring)."""
    lines = text.split("\n")
    heads = _headings(lines)
    if not heads or heads[0][0] != 0:
        heads = [(-2, 0, page_id), *heads]  # no title heading: the key stands in for it
    page_title = heads[0][2]
    sections: list[Section] = []
    used: dict[str, int] = {}
    stack: list[tuple[int, str]] = []  # (level, title) of the headings above the current one
    for n, (start, level, title) in enumerate(heads):
        end = heads[n + 1][0] if n + 1 < len(heads) else len(lines)
        body = "\n".join(lines[start + 2 : end]).strip("\n")
        while stack and stack[-1][0] >= level:
            stack.pop()
        path = tuple(t for _, t in stack)
        stack.append((level, title))
        if not body.strip():
            continue
        base = slugify(title)
        used[base] = used.get(base, 0) + 1
        if used[base] > 1:  # '"except" clause' and '"except*" clause' are both except-clause
            base = f"{base}-{used[base]}"
        pieces = _parts(body, max_chars)
        for k, piece in enumerate(pieces, 1):
            slug = f"{base}-part-{k}" if len(pieces) > 1 else base
            shown = f"{title} (part {k} of {len(pieces)})" if len(pieces) > 1 else title
            sections.append(Section(f"{page_id}:{slug}", page_id, shown, title, path, level + 1, piece))
    return Page(page_id, page_title, tuple(sections))


def load_topics(path: Path = SNAPSHOT) -> dict[str, str]:
    """The snapshot's topics: key → text."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("python") != SNAPSHOT_PYTHON:
        raise ValueError(f"{path} is from Python {data.get('python')}, expected {SNAPSHOT_PYTHON}")
    topics = data["topics"]
    if not isinstance(topics, dict) or not all(isinstance(v, str) for v in topics.values()):
        raise ValueError(f"{path}: 'topics' must map topic keys to text")
    return topics


@cache
def pages() -> dict[str, Page]:
    """Every page of the snapshot by id, split once per process."""
    return {key: split_page(key, text) for key, text in sorted(load_topics().items())}


@cache
def sections() -> dict[str, Section]:
    """Every section of every page by id."""
    return {s.id: s for page in pages().values() for s in page.sections}


def write_snapshot(path: Path = SNAPSHOT) -> None:
    """Save the running interpreter's ``pydoc_data.topics.topics`` as the snapshot."""
    from pydoc_data.topics import topics

    version = ".".join(map(str, sys.version_info[:3]))
    data = {
        "source": "pydoc_data.topics.topics (CPython's Lib/pydoc_data/topics.py), verbatim",
        "python": version,
        "license": "PSF-2.0; see PYTHON-LICENSE.txt next to this file",
        "topics": dict(sorted(topics.items())),
    }
    path.write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {len(topics)} topics from Python {version} to {path}")


if __name__ == "__main__":
    write_snapshot()
