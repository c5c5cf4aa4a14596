"""The three tools the model gets: plain typed functions whose docstrings become their schemas.

They read the shared, read-only corpus and index, so they are safe to run in ``ToolEnv``'s
threads at once. An unknown id raises ``NotFound`` with a hint (the closest ids); ``ToolEnv``
hands the model ``Error: <tool> raised NotFound: ...`` and counts it in ``<tool>_errors``. A search
that finds nothing, or a query with no words in it, is an ordinary answer saying so.
"""

from __future__ import annotations

import difflib

from wiki_search.corpus import pages, sections
from wiki_search.index import default_index

MAX_READ_CHARS = 4000
SEARCH_RESULTS = 5


class NotFound(LookupError):
    """No page or section has the id the model gave."""

    def __str__(self) -> str:  # LookupError would show the message in quotes
        return str(self.args[0]) if self.args else ""


def _suggest(wanted: str, known: list[str]) -> str:
    close = difflib.get_close_matches(wanted.strip(), known, n=3, cutoff=0.6)
    return f" Did you mean {', '.join(map(repr, close))}?" if close else ""


def search_pages(query: str) -> str:
    """Search the Python language reference for pages about a topic.

    Returns the best matching pages, each with its page id, title and a snippet of its best
    matching section (with that section's id). Pass a page id to view_sections to see all its
    sections, or a section id to read_section.

    Args:
        query: Words to look for, e.g. "assert statement exception". Plain words only: quotes,
            operators and other punctuation are ignored.
    """
    hits = default_index().search(query, SEARCH_RESULTS)
    if not hits:
        if not any(ch.isalnum() for ch in query):
            return "The query has no words to search for. Search with a few keywords, e.g. 'with statement'."
        return f"No page matches {query.strip()!r}. Try other or fewer keywords."
    lines = [f"{len(hits)} pages for {query.strip()!r}:"]
    for n, hit in enumerate(hits, 1):
        lines.append(
            f"{n}. page_id: {hit.page_id} | {hit.title}\n   best match, in {hit.section_id}: {hit.snippet}"
        )
    return "\n".join(lines)


def view_sections(page_id: str) -> str:
    """List the sections of a page: their section ids and titles.

    Args:
        page_id: A page id from search_pages, e.g. "compound".
    """
    page = pages().get(page_id.strip())
    if page is None:
        raise NotFound(
            f"no page has the id {page_id!r}; page ids come from search_pages."
            + _suggest(page_id, list(pages()))
        )
    lines = [f"Page {page.id}: {page.title} ({len(page.sections)} sections)"]
    for s in page.sections:
        indent = "  " * (s.level - 1)
        lines.append(f"{indent}- section_id: {s.id} | {s.title} ({len(s.text)} chars)")
    return "\n".join(lines)


def read_section(section_id: str) -> str:
    """Read the text of one section, at most 4000 characters of it.

    Args:
        section_id: A section id from view_sections, e.g. "compound:the-try-statement".
    """
    section = sections().get(section_id.strip())
    if section is None:
        page_id = section_id.strip().partition(":")[0]
        where = f" view_sections({page_id!r}) lists its sections." if page_id in pages() else ""
        raise NotFound(
            f"no section has the id {section_id!r}; section ids come from view_sections."
            + (_suggest(section_id, list(sections())) or where)
        )
    heading = " > ".join((*section.path, section.title))
    text = section.text
    if len(text) > MAX_READ_CHARS:
        text = text[:MAX_READ_CHARS] + (
            f"\n[... truncated: the first {MAX_READ_CHARS} of {len(section.text)} characters shown]"
        )
    return f"Section {section.id} ({heading})\n\n{text}"
