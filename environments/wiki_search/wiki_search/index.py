"""The search index: SQLite FTS5 over every section, ranked by BM25, built once per process.

Two FTS5 tables, tokenised by ``unicode61`` with ``_`` kept inside words (so ``__init__`` is one
term) and Porter stemming (``raised`` finds ``raise``): ``sections``, a row per section (page
title, section title, text), and ``titles``, a row per page (its title, its other section headings). A
page's score is its best section's ``bm25()`` plus its ``titles`` row's, and its snippet comes
from that best section.

The index lives in an in-memory database shared by every rollout. Sync tools run in a thread pool,
so the one connection is opened with ``check_same_thread=False`` and every query holds a lock
(SQLite connections must not be used by two threads at once); queries take about a millisecond.

A model's query is free text, never FTS5 syntax: ``match_expression`` keeps its words, quotes each
one and ORs them, so quotes, ``*``, ``NEAR``, ``AND``, ``-`` or parentheses cannot make the MATCH
fail or change its meaning.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from dataclasses import dataclass
from functools import cache

from wiki_search.corpus import Page, pages

WORD = re.compile(r"\w+")
MAX_TERMS = 32  # words of a query that are searched; the rest are ignored
SECTION_WEIGHTS = (2.0, 2.0, 1.0)  # bm25 column weights: page title, section title, text
TITLE_WEIGHTS = (2.0, 1.0)  # bm25 column weights of the titles table: page title, section titles
SNIPPET_TOKENS = 24


@dataclass(frozen=True)
class Hit:
    """A page found by a search: its id and title, the best section's id, a snippet, the score
    (``bm25()``: lower is better)."""

    page_id: str
    title: str
    section_id: str
    snippet: str
    score: float


def terms(query: str) -> list[str]:
    """The words of ``query`` that are searched (at most ``MAX_TERMS``, duplicates dropped)."""
    seen: dict[str, None] = {}
    for word in WORD.findall(query.lower()):
        seen.setdefault(word, None)
    return list(seen)[:MAX_TERMS]


def match_expression(query: str) -> str | None:
    """A safe FTS5 MATCH expression for free text: each word quoted, ORed; None if there is none.

    ``'what does "NEAR(a b)" do?*'`` → ``'"what" OR "does" OR "near" OR "a" OR "b" OR "do"'``.
    Words are made of letters, digits and ``_`` only, so quoting needs no escaping; inside quotes
    ``NEAR``, ``AND``, ``OR`` and ``NOT`` are plain words.
    """
    words = terms(query)
    return " OR ".join(f'"{w}"' for w in words) if words else None


class Index:
    """The FTS5 index of ``pages``; safe to query from several threads at once."""

    def __init__(self, pages: dict[str, Page]) -> None:
        self.pages = pages
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        tokenize = "tokenize = \"porter unicode61 tokenchars '_'\""
        self._db.execute(
            "CREATE VIRTUAL TABLE sections USING fts5("
            f"page_id UNINDEXED, section_id UNINDEXED, page_title, section_title, body, {tokenize})"
        )
        self._db.execute(
            f"CREATE VIRTUAL TABLE titles USING fts5(page_id UNINDEXED, title, headings, {tokenize})"
        )
        self._db.executemany(
            "INSERT INTO sections VALUES (?, ?, ?, ?, ?)",
            [(page.id, s.id, page.title, s.title, s.text) for page in pages.values() for s in page.sections],
        )
        self._db.executemany(
            "INSERT INTO titles VALUES (?, ?, ?)",
            [(p.id, p.title, "\n".join(_headings(p))) for p in pages.values()],
        )
        self._db.commit()

    def search(self, query: str, limit: int = 5) -> list[Hit]:
        """The ``limit`` best pages for the free-text ``query`` (none for a query without words).

        A page's score is its best section's ``bm25()`` plus the ``bm25()`` of its titles (a term
        in most sections, like "statement" or "if", weighs almost nothing among sections, but a
        page titled with it still comes first). Pages whose title is the query's words, in order,
        come before all others.
        """
        expression = match_expression(query)
        if expression is None or limit < 1:
            return []
        rank_sql = (
            "SELECT rowid, page_id, section_id, bm25(sections, 0, 0, ?, ?, ?) AS score "
            "FROM sections WHERE sections MATCH ? ORDER BY score, rowid"
        )
        title_sql = "SELECT page_id, bm25(titles, 0, ?, ?) FROM titles WHERE titles MATCH ?"
        with self._lock:
            rows = self._db.execute(rank_sql, (*SECTION_WEIGHTS, expression)).fetchall()
            title_scores = dict(self._db.execute(title_sql, (*TITLE_WEIGHTS, expression)).fetchall())
        best: dict[str, tuple[int, str, float]] = {}  # page id: (rowid, section id, score)
        for rowid, page_id, section_id, score in rows:
            if page_id not in best:
                best[page_id] = (rowid, section_id, score + title_scores.get(page_id, 0.0))
        exact = terms(query)  # a page titled exactly the query goes first, as on a wiki
        ranked = sorted(best, key=lambda p: (terms(self.pages[p].title) != exact, best[p][2], p))[:limit]
        # snippets cost ~50 µs a row: made for the rows shown only
        chosen = [best[p][0] for p in ranked]
        snippet_sql = (
            f"SELECT rowid, snippet(sections, 4, '', '', ' … ', {SNIPPET_TOKENS}) FROM sections "
            f"WHERE sections MATCH ? AND rowid IN ({', '.join('?' * len(chosen))})"
        )
        with self._lock:
            snippets = dict(self._db.execute(snippet_sql, (expression, *chosen)).fetchall())
        return [
            Hit(
                p, self.pages[p].title, best[p][1], " ".join(snippets.get(best[p][0], "").split()), best[p][2]
            )
            for p in ranked
        ]


def _headings(page: Page) -> list[str]:
    """The page's section headings, each once, without the page's own title."""
    return [h for h in dict.fromkeys(s.heading for s in page.sections) if h != page.title]


@cache
def default_index() -> Index:
    """The index of the corpus snapshot, built on first use and shared by the whole process."""
    return Index(pages())
