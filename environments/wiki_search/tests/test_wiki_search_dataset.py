"""The questions against the corpus, the splits, and the reward functions on hand-made completions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from wiki_search import corpus
from wiki_search.dataset import QUESTIONS, rows
from wiki_search.rewards import answer_format, exact_match, normalize, read_gold_section

import palaestra as pa


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("q", QUESTIONS, ids=[q.answer for q in QUESTIONS])
def test_every_answer_is_written_in_its_gold_section(q: Any) -> None:
    section = corpus.sections()[q.section_id]
    assert flat(q.evidence) in flat(section.text)
    assert q.answer in q.evidence
    assert q.answer in flat(section.text)
    assert all(alias in q.evidence or alias.removesuffix("()") in q.evidence for alias in q.aliases)


def test_the_questions_are_many_distinct_and_spread_over_pages() -> None:
    assert len(QUESTIONS) >= 40
    assert len({q.question for q in QUESTIONS}) == len(QUESTIONS)
    assert len({q.section_id.split(":")[0] for q in QUESTIONS}) >= 20


def test_splits_partition_the_questions() -> None:
    train, evaluation, everything = rows("train"), rows("eval"), rows("all")
    assert len(everything) == len(QUESTIONS)
    assert len(evaluation) == len(QUESTIONS) // 5
    assert sorted(r["question"] for r in train + evaluation) == sorted(r["question"] for r in everything)
    assert evaluation[0] == QUESTIONS[4].row()
    assert everything[0]["info"] == {
        "section_id": "assert:the-assert-statement",
        "evidence": "if not expression: raise AssertionError",
        "aliases": [],
    }
    with pytest.raises(ValueError, match="split must be one of"):
        rows("test")


def reply(text: str) -> pa.Messages:
    return [{"role": "assistant", "content": text}]


PARSER = pa.XMLParser(["answer"])


@pytest.mark.parametrize(
    ("said", "answer", "aliases", "score"),
    [
        ("AssertionError", "AssertionError", [], 1.0),
        (" `assertionerror`. ", "AssertionError", [], 1.0),
        ("**AssertionError**", "AssertionError", [], 1.0),
        ("The AssertionError", "AssertionError", [], 1.0),
        ('"__init__()"', "__init__", [], 1.0),
        ("id", "id()", ["id"], 1.0),
        ("functools.total_ordering", "functools.total_ordering()", [], 1.0),
        ("pep 3104", "PEP 3104", ["3104"], 1.0),
        ("3104", "PEP 3104", ["3104"], 1.0),
        ("utf-8", "UTF-8", [], 1.0),
        ("-(x+1)", "-(x+1)", [], 1.0),
        ("...", "...", [], 1.0),
        ("`...`", "...", [], 1.0),
        ("－1", "-1", [], 1.0),  # a fullwidth minus, folded by NFKC
        ("1", "-1", [], 0.0),  # a sign is part of the answer
        ("AssertionError exception", "AssertionError", [], 0.0),  # no "contains"
        ("AssertionError or TypeError", "AssertionError", [], 0.0),
        ("init", "__init__", [], 0.0),
        ("", "AssertionError", [], 0.0),
    ],
)
def test_exact_match_normalizes_wrappers_not_contents(
    said: str, answer: str, aliases: list[str], score: float
) -> None:
    completion = reply(f"<answer>{said}</answer>")
    assert exact_match(PARSER, completion, answer, {"aliases": aliases}) == score


def test_exact_match_needs_the_answer_tags() -> None:
    assert exact_match(PARSER, reply("AssertionError"), "AssertionError", {}) == 0.0
    assert exact_match(PARSER, [], "AssertionError", {}) == 0.0
    assert normalize(None) == ""


def test_answer_format_scores_the_last_reply_only() -> None:
    call = {"id": "c0", "type": "function", "function": {"name": "search_pages", "arguments": "{}"}}
    completion = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "..."},
        {"role": "assistant", "content": "<answer>x</answer>"},
    ]
    assert answer_format(PARSER, completion) == 1.0
    assert answer_format(PARSER, completion[:2]) == 0.0
    assert answer_format(PARSER, []) == 0.0


def read_calls(*reads: tuple[str, str, str]) -> pa.Messages:
    """A completion: one assistant turn calling (tool, id argument) and the tool results given."""
    calls = [
        {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": json.dumps({"x": arg})}}
        for n, (name, arg, _) in enumerate(reads)
    ]
    results = [{"role": "tool", "tool_call_id": f"c{n}", "content": out} for n, (*_, out) in enumerate(reads)]
    return [{"role": "assistant", "content": None, "tool_calls": calls}, *results]


def test_read_gold_section_counts_the_text_read_not_the_id() -> None:
    q = QUESTIONS[0]
    gold = corpus.sections()[q.section_id].text
    info = q.row()["info"]
    assert read_gold_section(read_calls(("read_section", q.section_id, gold)), info) == 1.0
    # the gold text reached some other way (a search snippet) does not count as reading it
    assert read_gold_section(read_calls(("search_pages", "assert", gold)), info) == 0.0
    assert (
        read_gold_section(read_calls(("read_section", "x", "Error: read_section raised NotFound")), info)
        == 0.0
    )
    assert read_gold_section(read_calls(("read_section", "del:the-del-statement", "other text")), info) == 0.0
    assert read_gold_section([], info) == 0.0


def test_a_copy_of_the_gold_section_on_another_page_counts() -> None:
    [q] = [q for q in QUESTIONS if q.section_id == "compound:finally-clause"]
    copy = corpus.sections()["try:finally-clause"].text
    assert read_gold_section(read_calls(("read_section", "try:finally-clause", copy)), q.row()["info"]) == 1.0
