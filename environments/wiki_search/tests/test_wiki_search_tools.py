"""The three tools called directly: their schemas, their answers and their error messages."""

from __future__ import annotations

import pytest
from wiki_search import corpus
from wiki_search.tools import MAX_READ_CHARS, NotFound, read_section, search_pages, view_sections

import palaestra as pa


def test_schemas_come_from_the_signatures_and_docstrings() -> None:
    schemas = {
        f.__name__: pa.Tool.from_function(f).schema["function"]
        for f in (search_pages, view_sections, read_section)
    }
    assert schemas["search_pages"]["parameters"]["required"] == ["query"]
    assert schemas["view_sections"]["parameters"]["properties"]["page_id"]["type"] == "string"
    assert schemas["read_section"]["parameters"]["additionalProperties"] is False
    assert "4000 characters" in schemas["read_section"]["description"]
    assert all(s["description"] and s["parameters"]["properties"] for s in schemas.values())


def test_search_pages_lists_pages_with_ids_titles_and_snippets() -> None:
    text = search_pages("assert statement")
    lines = text.splitlines()
    assert lines[0] == "5 pages for 'assert statement':"
    assert lines[1] == '1. page_id: assert | The "assert" statement'
    assert lines[2].startswith("   best match, in assert:the-assert-statement: ")
    assert len([line for line in lines if "page_id:" in line]) == 5


@pytest.mark.parametrize("query", ["", "   ", "?!*", '""', "()"])
def test_a_query_without_words_is_told_so(query: str) -> None:
    assert search_pages(query).startswith("The query has no words to search for.")


def test_a_query_that_matches_nothing_is_told_so() -> None:
    assert search_pages("qqzzv") == "No page matches 'qqzzv'. Try other or fewer keywords."


def test_view_sections_lists_ids_titles_and_sizes_indented_by_level() -> None:
    text = view_sections("try")
    lines = text.splitlines()
    assert lines[0] == 'Page try: The "try" statement (6 sections)'
    assert lines[1] == '- section_id: try:the-try-statement | The "try" statement (764 chars)'
    assert lines[2].startswith('  - section_id: try:except-clause-part-1 | "except" clause (part 1 of 2) (')
    assert view_sections("  try ") == text  # stray spaces around an id are forgiven


def test_read_section_gives_the_text_under_its_heading_path() -> None:
    text = read_section("compound:finally-clause")
    header, _, body = text.partition("\n\n")
    assert (
        header
        == 'Section compound:finally-clause (Compound statements > The "try" statement > "finally" clause)'
    )
    assert body == corpus.sections()["compound:finally-clause"].text


def test_read_section_caps_long_sections_and_says_so() -> None:
    longest = max(corpus.sections().values(), key=lambda s: len(s.text))
    assert len(longest.text) > MAX_READ_CHARS
    text = read_section(longest.id)
    assert text.endswith(
        f"[... truncated: the first {MAX_READ_CHARS} of {len(longest.text)} characters shown]"
    )
    assert longest.text[:MAX_READ_CHARS] in text and longest.text not in text


def test_unknown_ids_raise_not_found_with_a_hint() -> None:
    with pytest.raises(NotFound) as info:
        view_sections("tyr")
    assert str(info.value) == "no page has the id 'tyr'; page ids come from search_pages. Did you mean 'try'?"
    with pytest.raises(NotFound, match=r"view_sections\('try'\) lists its sections\.$"):
        read_section("try:the-whole-thing")
    with pytest.raises(NotFound) as info:
        read_section("assert:the-assert-statment")
    assert "section ids come from view_sections. Did you mean 'assert:the-assert-statement'," in str(
        info.value
    )
    with pytest.raises(
        NotFound, match=r"^no section has the id 'xyzzy'; section ids come from view_sections\.$"
    ):
        read_section("xyzzy")
