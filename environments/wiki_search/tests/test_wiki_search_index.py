"""The corpus split into pages and sections, and the FTS5 index: ranking, query sanitising, threads."""

from __future__ import annotations

import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from wiki_search import corpus
from wiki_search.index import MAX_TERMS, Index, default_index, match_expression, terms


def test_the_snapshot_has_every_topic_split_into_sections() -> None:
    pages = corpus.pages()
    assert len(pages) == 79
    ids = [s.id for page in pages.values() for s in page.sections]
    assert len(ids) == len(set(ids)) == len(corpus.sections())
    for page in pages.values():
        assert page.sections, page.id
        for s in page.sections:
            assert s.id.startswith(f"{page.id}:") and re.fullmatch(r"[a-z0-9_-]+", s.id.split(":", 1)[1])
            assert s.text.strip() and s.page_id == page.id
            # parts stay under the limit unless one paragraph (a table) is longer by itself
            longest = max(len(p) for p in re.split(r"\n\s*\n", s.text))
            assert len(s.text) <= corpus.MAX_SECTION_CHARS or longest > corpus.MAX_SECTION_CHARS // 2


def test_sections_hold_all_of_a_page_but_its_headings() -> None:
    topics = corpus.load_topics()
    for page_id, text in topics.items():
        lines = text.split("\n")
        heading_lines = set()
        for i, _, _ in corpus._headings(lines):
            heading_lines |= {i, i + 1}
        body = "".join(line for i, line in enumerate(lines) if i not in heading_lines)
        sections = "".join(s.text for s in corpus.pages()[page_id].sections)
        assert "".join(sections.split()) == "".join(body.split()), page_id


def test_split_page_levels_paths_empty_headings_and_parts() -> None:
    text = "\n".join(
        [
            "The page",
            "********",
            "",
            "Intro text.",
            "",
            "Group",
            "=====",
            "",  # no text of its own: not a section
            "Alpha",
            "-----",
            "",
            "Alpha text.",
            "",
            "Alpha",
            "-----",
            "",
            "Second alpha.",
            "",
            "Long",
            "====",
            "",
            "x" * 40,
            "",
            "y" * 40,
            "",
            "z" * 40,
        ]
    )
    page = corpus.split_page("p", text, max_chars=90)
    assert page.title == "The page"
    got = [(s.id, s.title, s.path, s.level) for s in page.sections]
    assert got == [
        ("p:the-page", "The page", (), 1),
        ("p:alpha", "Alpha", ("The page", "Group"), 3),
        ("p:alpha-2", "Alpha", ("The page", "Group"), 3),
        ("p:long-part-1", "Long (part 1 of 2)", ("The page",), 2),
        ("p:long-part-2", "Long (part 2 of 2)", ("The page",), 2),
    ]
    assert page.sections[3].text == "x" * 40 + "\n\n" + "y" * 40
    assert corpus.slugify('The "try" statement') == "the-try-statement"
    assert corpus.slugify("__slots__") == "__slots__"


@pytest.mark.skipif(sys.version_info[:3] != (3, 11, 7), reason="the snapshot is of Python 3.11.7")
def test_the_snapshot_is_this_pythons_pydoc_topics() -> None:
    from pydoc_data.topics import topics

    assert corpus.load_topics() == topics


def test_a_page_title_finds_that_page_first() -> None:
    index = default_index()
    for page in corpus.pages().values():
        hits = index.search(page.title)
        assert hits[0].title == page.title, page.id  # "if" and "else" are one text under two keys
        assert page.id in [h.page_id for h in hits[:2]]


def test_bm25_ranks_the_page_about_a_question_first() -> None:
    index = default_index()
    cases = {
        "assert statement AssertionError": "assert",
        "nonlocal enclosing scope": "nonlocal",
        "soft keywords match case": "identifiers",
        "right shift floor division pow": "shifting",
        "imaginary literal complex real part": "imaginary",
    }
    for query, page_id in cases.items():
        hits = index.search(query)
        assert hits[0].page_id == page_id, (query, [h.page_id for h in hits])
        assert [h.score for h in hits] == sorted(h.score for h in hits)  # bm25: lower is better
        assert len({h.page_id for h in hits}) == len(hits) == 5
    contains = index.search("__contains__ membership test")
    assert contains[0].page_id in ("in", "comparisons", "sequence-types", "specialnames")
    assert "__contains__" in " ".join(h.snippet for h in contains)  # `_` is part of a word


def test_the_snippet_comes_from_the_best_section() -> None:
    [hit, *_] = default_index().search("StopAsyncIteration asynchronous generator return")
    assert hit.section_id in corpus.sections()
    assert hit.section_id.startswith(f"{hit.page_id}:")
    assert "StopAsyncIteration" in hit.snippet
    assert all(word in corpus.sections()[hit.section_id].text for word in hit.snippet.strip(" …").split()[:3])


@pytest.mark.parametrize(
    ("query", "expression"),
    [
        ("with statement", '"with" OR "statement"'),
        ('what does "NEAR(a b)" do?*', '"what" OR "does" OR "near" OR "a" OR "b" OR "do"'),
        ("x AND y OR NOT z", '"x" OR "and" OR "y" OR "or" OR "not" OR "z"'),
        ("col:term ^start -minus +plus", '"col" OR "term" OR "start" OR "minus" OR "plus"'),
        ("__init__() super().__init__", '"__init__" OR "super"'),
        ('"unbalanced (quote', '"unbalanced" OR "quote"'),
        ("Straße Ünïcode", '"straße" OR "ünïcode"'),
        ("", None),
        ("   ", None),
        ('*"()-^:+', None),
        ("\x00\n\t", None),
    ],
)
def test_match_expression_quotes_words_and_ors_them(query: str, expression: str | None) -> None:
    assert match_expression(query) == expression


def test_long_queries_keep_their_first_words() -> None:
    words = [f"w{i}" for i in range(100)]
    assert terms(" ".join(words)) == words[:MAX_TERMS]
    assert terms("a A a b") == ["a", "b"]


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '""',
        "*",
        "a*",
        "NEAR",
        "NEAR(a b, 3)",
        "(",
        ")",
        "AND",
        "OR NOT",
        "col:term",
        "^x",
        "-x",
        "'",
        "\x00",
        "🙂",
        "é" * 3,
        "word " * 5000,
        '"a" "b" NEAR/2 (c OR d)*',
    ],
)
def test_no_query_breaks_the_match_syntax(query: str) -> None:
    hits = default_index().search(query)
    assert isinstance(hits, list)
    if re.search(r"[a-z]", query, re.I):
        assert hits  # a word found somewhere


def test_nothing_found_is_an_empty_list() -> None:
    assert default_index().search("zzqxv qqzzv") == []
    assert default_index().search("") == []
    assert default_index().search("assert", limit=0) == []


def test_searches_from_many_threads_agree_with_one_thread() -> None:
    index = Index(corpus.pages())  # its own connection, so other tests cannot interfere
    queries = [page.title for page in corpus.pages().values()] * 3
    expected = [index.search(q) for q in queries]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(index.search, queries))
    assert got == expected
