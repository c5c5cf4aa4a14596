"""Tests for palaestra.parsers: answer extraction, format rewards, robustness and speed."""

from __future__ import annotations

import inspect
import random
import re
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from palaestra.parsers import ParsedXML, Parser, ThinkParser, XMLParser

TIME_BUDGET_S = 2.0


def chat(*replies: str | None) -> list[dict]:
    """A conversation: system and user turns, then the replies with a tool turn between each."""
    messages: list[dict] = [{"role": "system", "content": "Be brief."}]
    messages.append({"role": "user", "content": "<answer>user</answer>"})
    for i, reply in enumerate(replies):
        if i:
            messages.append({"role": "tool", "tool_call_id": "c", "content": "<answer>9</answer>"})
        messages.append({"role": "assistant", "content": reply})
    return messages


# --- Parser -------------------------------------------------------------------------------------


def test_parser_answer_is_last_assistant_message_stripped() -> None:
    messages = chat("first", "  second  ")
    messages.append({"role": "user", "content": "thanks"})
    assert Parser().parse_answer(messages) == "second"
    assert Parser().parse_answer(" 7 ") == "7"
    assert Parser().parse("  42 \n") == "42"


@pytest.mark.parametrize(
    "completion",
    [
        [],
        [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}],
        chat("an answer", None),
        chat("an answer", "   \n"),
        "   ",
        "",
    ],
)
def test_parser_answer_none_without_a_non_blank_last_reply(completion: list | str) -> None:
    assert Parser().parse_answer(completion) is None


def test_assistant_texts_handles_none_parts_and_junk() -> None:
    messages = [
        {"role": "assistant", "content": None},
        {"role": "assistant", "content": [{"type": "text", "text": "<ans"}, {"text": "wer>"}]},
        {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": 42},
        {"role": "user", "content": "not me"},
        "not a message",
        {"content": "no role"},
    ]
    assert Parser.assistant_texts(messages) == ["", "<answer>", "", ""]  # type: ignore[arg-type]
    assert Parser.assistant_texts("just text") == ["just text"]
    parts = [{"type": "text", "text": "<answer>"}, {"type": "text", "text": " 4 </answer>"}]
    assert XMLParser(["answer"]).parse_answer([{"role": "assistant", "content": parts}]) == "4"


def test_parser_format_reward_needs_one_non_blank_reply() -> None:
    parser = Parser()
    assert parser.format_reward(chat(None, "ok")) == 1.0
    assert parser.format_reward(chat(None, "  ")) == 0.0
    assert parser.format_reward([]) == 0.0
    assert parser.format_reward([{"role": "user", "content": "hi"}]) == 0.0


def test_format_reward_func_binds_by_name_completion() -> None:
    func = XMLParser(["answer"]).format_reward_func()
    assert func.__name__ == "format_reward"
    assert list(inspect.signature(func).parameters) == ["completion"]
    assert func(completion="<answer>1</answer>") == 1.0
    assert func(completion="<answer>1") == 0.0


# --- XMLParser construction ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "answer_field", "match"),
    [
        ([], None, "at least one field"),
        ([""], None, "invalid tag name"),
        (["1abc"], None, "invalid tag name"),
        (["an swer"], None, "invalid tag name"),
        (["<answer>"], None, "invalid tag name"),
        (["answer\n"], None, "invalid tag name"),
        ([("answer", "")], None, "invalid tag name"),
        ([()], None, "non-empty tuple"),
        ([3], None, "expected a tag name"),
        (["answer", "answer"], None, "duplicate tag name 'answer'"),
        (["think", ("answer", "think")], None, "duplicate tag name 'think'"),
        (["think", "answer"], "final", "answer_field 'final' not in"),
        ([("answer", "final")], "final", "answer_field 'final' not in"),
    ],
)
def test_xml_parser_rejects_bad_fields(fields: list, answer_field: str | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        XMLParser(fields, answer_field=answer_field)


def test_xml_parser_rejects_a_bare_string() -> None:
    with pytest.raises(TypeError, match="list of tag names"):
        XMLParser("answer")


def test_xml_parser_names_and_default_answer_field() -> None:
    parser = XMLParser(["think", ("answer", "final"), "a.b-c_1"])
    assert parser.field_names == ("think", "answer", "a.b-c_1")
    assert parser.answer_field == "a.b-c_1"
    assert XMLParser(["think", "answer", "note"], answer_field="answer").answer_field == "answer"


# --- XMLParser.parse ----------------------------------------------------------------------------

PARSER = XMLParser(["think", ("answer", "final")])


def test_parse_fields_stripped_and_absent_is_none() -> None:
    parsed = PARSER.parse("<think>\n add \n</think>\n<answer> 4 </answer>")
    assert isinstance(parsed, ParsedXML)
    assert (parsed.think, parsed.answer) == ("add", "4")
    assert parsed["answer"] == "4"
    assert parsed.as_dict() == {"think": "add", "answer": "4"}
    assert PARSER.parse("<answer>4</answer>").think is None
    assert PARSER.parse("<answer>  </answer>").answer == ""


def test_parse_alternative_is_reported_under_canonical_name() -> None:
    assert PARSER.parse("<final>5</final>").answer == "5"
    assert PARSER.parse("<answer>1</answer> <final>2</final>").answer == "2"
    assert PARSER.parse("<final>2</final> <answer>1</answer>").answer == "1"


def test_parse_last_closed_occurrence_wins() -> None:
    assert PARSER.parse("<answer>draft</answer> then <answer>final</answer>").answer == "final"
    assert PARSER.parse("<answer>done</answer> <answer>unclosed").answer == "done"


def test_parse_multiline_content_with_other_text() -> None:
    text = "Sure.\n<answer>\nline 1\n x < y and a > b\n</answer>\nBye"
    assert PARSER.parse(text).answer == "line 1\n x < y and a > b"


@pytest.mark.parametrize(
    "text",
    [
        "<answer>4",
        "4</answer>",
        "<answer>4</final>",
        "<Answer>4</Answer>",
        "< answer>4</answer>",
        "<answer >4</answer >",
        '<answer id="1">4</answer>',
        "<answer>4<answer>",
        "",
    ],
)
def test_parse_unclosed_mismatched_or_inexact_tags_never_match(text: str) -> None:
    assert PARSER.parse(text).answer is None


def test_parse_pairs_like_a_lazy_regex() -> None:
    assert PARSER.parse("<answer>a<answer>b</answer>").answer == "a<answer>b"
    assert PARSER.parse("<answer><answer>x</answer></answer>").answer == "<answer>x"
    assert PARSER.parse("<answer>a <final>b</final>").answer == "b"
    assert PARSER.parse("<answer>a</final>b</answer>").answer == "a</final>b"


def test_parsed_xml_get_and_item_access() -> None:
    parsed = XMLParser(["get", "x.y"]).parse("<get>1</get><x.y>2</x.y>")
    assert parsed["get"] == "1"
    assert parsed["x.y"] == "2"
    assert parsed.get("x.y") == "2"
    assert PARSER.parse("").get("answer", "fallback") == "fallback"
    assert PARSER.parse("").get("unknown") is None
    with pytest.raises(KeyError):
        PARSER.parse("")["unknown"]
    with pytest.raises(AttributeError, match="no field 'unknown'"):
        _ = PARSER.parse("").unknown


def test_xml_parse_answer_from_message_list() -> None:
    messages = chat("<answer>3</answer>", "<think>hmm</think><final> 4 </final>")
    assert PARSER.parse_answer(messages) == "4"
    assert PARSER.parse_answer(chat("<answer>3</answer>", "no tags")) is None
    assert PARSER.parse_answer(chat("<answer>3</answer>", None)) is None
    assert PARSER.parse_answer([{"role": "user", "content": "<answer>1</answer>"}]) is None
    first = XMLParser(["answer", "why"], answer_field="answer")
    assert first.parse_answer("<answer>1</answer><why>2</why>") == "1"


# --- XMLParser.format and format_reward ---------------------------------------------------------


def test_format_renders_in_declared_order() -> None:
    assert PARSER.format(answer=4, think="2+2") == "<think>\n2+2\n</think>\n<answer>\n4\n</answer>"
    assert PARSER.format(answer="4") == "<answer>\n4\n</answer>"
    assert PARSER.format(think=None, answer="4") == "<answer>\n4\n</answer>"
    with pytest.raises(ValueError, match="unknown fields \\['final'\\]"):
        PARSER.format(final="4")


GOOD = "<think>2+2</think>\n<answer>4</answer>"


@pytest.mark.parametrize(
    "text",
    [
        GOOD,
        "Sure!\n" + GOOD + "\nDone.",
        "<think></think><final>4</final>",
        PARSER.format(think="a", answer="b"),
    ],
)
def test_format_score_perfect(text: str) -> None:
    assert PARSER.format_score(text) == 1.0
    assert PARSER.format_reward(text) == 1.0
    assert PARSER.format_reward(chat(text)) == 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>2+2</think><answer>1</think>", 0.0),  # mismatched close
        ("<think>2+2</think><answer>1", 0.0),  # unclosed
        ("<think>2+2</think></answer>", 0.0),  # close without open
        ("<think>2+2</think><answer><answer>x</answer></answer>", 0.0),  # nested
        ("<think><answer>x</answer></think>", 0.0),  # a field inside another
        ("<think>a</think><answer>1</final>", 0.0),  # alternatives must pair by name
        (GOOD + "<answer>", 0.0),  # trailing stray opening tag
        ("<think>a</think><answer>1</answer><answer>2</answer>", 0.5),  # answer twice
        ("<think>a</think><answer>1</answer><final>2</final>", 0.5),  # answer twice, by alias
        ("<answer>4</answer>", 0.5),  # think missing
        ("<answer>4</answer><think>2+2</think>", 0.5),  # out of order: halved
        ("no tags at all", 0.0),
        ("", 0.0),
    ],
)
def test_format_score_bad_messages(text: str, expected: float) -> None:
    assert PARSER.format_score(text) == expected


def test_format_reward_is_mean_over_assistant_messages() -> None:
    assert PARSER.format_reward(chat(GOOD, "<answer>1")) == 0.5
    assert PARSER.format_reward(chat(GOOD, "<answer>4</answer>", GOOD, None)) == pytest.approx(
        (1 + 0.5 + 1 + 0) / 4
    )
    assert PARSER.format_reward([]) == 0.0
    assert PARSER.format_reward([{"role": "user", "content": GOOD}]) == 0.0


# --- ThinkParser --------------------------------------------------------------------------------


def test_think_parser_answer_after_last_think_close() -> None:
    parser = ThinkParser()
    assert parser.parse("<think>a</think> 4 ") == "4"
    assert parser.parse("<think>a</think>x<think>b</think> y") == "y"
    assert parser.parse(" plain answer ") == "plain answer"
    assert parser.parse("<think>never closed... 4") is None
    assert parser.parse("prompt-side opening</think>4") == "4"
    assert parser.parse_answer(chat("<think>a</think>1", "<think>b</think> 2")) == "2"
    assert parser.parse_answer(chat("<think>b</think>   ")) is None
    assert parser.parse_answer(chat("<think>unclosed")) is None


def test_think_parser_reasoning() -> None:
    parser = ThinkParser()
    assert parser.think("<think>\n step \n</think>4") == "step"
    assert parser.think("step one</think>4") == "step one"
    assert parser.think("<think>a</think>x<think>b</think>y") == "a</think>x<think>b"
    assert parser.think("<think>unclosed") is None
    assert parser.think("4") is None


def test_think_parser_with_inner_xml_parser() -> None:
    parser = ThinkParser(XMLParser(["answer"]))
    parsed = parser.parse("<think>I'll write <answer>9</answer></think><answer>4</answer>")
    assert isinstance(parsed, ParsedXML)
    assert parsed.answer == "4"
    assert parser.parse("<think>unclosed <answer>4</answer>") is None
    assert parser.parse_answer(chat("<think>x</think>\n<answer> 4 </answer>")) == "4"
    assert parser.parse_answer(chat("<think><answer>9</answer></think>4")) is None
    assert parser.parse_answer(chat("<think>x</think><answer>4")) is None


@pytest.mark.parametrize(
    ("text", "plain", "with_xml"),
    [
        ("<think>a</think>4", 1.0, 0.0),
        ("\n  <think>a</think>\n<answer>4</answer>", 1.0, 1.0),
        ("<think></think><answer>4</answer>", 1.0, 1.0),
        ("<think>a</think>", 0.0, 0.0),  # no answer
        ("<think>a</think>   ", 0.0, 0.0),
        ("4", 0.0, 0.0),  # no reasoning
        ("<answer>4</answer>", 0.0, 0.0),
        ("Hi <think>a</think><answer>4</answer>", 0.0, 0.0),  # text before reasoning
        ("<think>a</think><think>b</think><answer>4</answer>", 0.0, 0.0),  # two blocks
        ("<think>a<think>b</think><answer>4</answer>", 0.0, 0.0),  # nested opening
        ("<think>a</think><answer>4</answer></think>", 0.0, 0.0),  # stray close
        ("<think>a <answer>4</answer>", 0.0, 0.0),  # never closed
        ("<think>a</think><answer>4</answer><answer>5</answer>", 1.0, 0.0),  # inner not perfect
    ],
)
def test_think_format_score(text: str, plain: float, with_xml: float) -> None:
    assert ThinkParser().format_score(text) == plain
    assert ThinkParser(XMLParser(["answer"])).format_score(text) == with_xml


def test_think_format_reward_is_mean_over_messages() -> None:
    parser = ThinkParser()
    assert parser.format_reward(chat("<think>a</think>1", "2", "<think>b</think>3")) == 2 / 3
    assert parser.format_reward([]) == 0.0


# --- Fuzzing ------------------------------------------------------------------------------------

ALL_CHARS = st.characters(exclude_categories=())
FRAGMENTS = [
    "<answer>",
    "</answer>",
    "<final>",
    "</final>",
    "<think>",
    "</think>",
    "<",
    ">",
    "/",
    "answer",
    "think",
    " ",
    "\n",
    "\x00",
    "\ud800",
    "é",
    "🙂",
    "<answer",
    "</",
    "4",
    "word",
]
PIECE = st.sampled_from(FRAGMENTS) | st.text(ALL_CHARS, max_size=4)
TAGGY_TEXT = st.lists(PIECE, max_size=40).map("".join)
ANY_TEXT = st.text(ALL_CHARS, max_size=200) | TAGGY_TEXT
PARSERS = [Parser(), PARSER, ThinkParser(), ThinkParser(XMLParser([("answer", "final")]))]
FUZZ = settings(derandomize=True, max_examples=300, deadline=None)


def oracle(text: str, names: tuple[str, ...]) -> str | None:
    """The documented parse rule, spelled as the lazy regex it is equivalent to."""
    alternation = "|".join(map(re.escape, names))
    found = re.findall(f"<({alternation})>(.*?)</\\1>", text, re.DOTALL)
    return found[-1][1].strip() if found else None


@FUZZ
@given(text=ANY_TEXT)
def test_fuzz_parsers_never_raise_and_return_documented_types(text: str) -> None:
    for parser in PARSERS:
        for completion in (text, chat(text), [{"role": "assistant", "content": [{"text": text}]}]):
            answer = parser.parse_answer(completion)
            assert answer is None or isinstance(answer, str)
            reward = parser.format_reward(completion)
            assert 0.0 <= reward <= 1.0
        score = parser.format_score(text)
        assert 0.0 <= score <= 1.0
        parser.parse(text)
    assert isinstance(PARSERS[1].parse(text), ParsedXML)
    think = PARSERS[2].think(text)
    assert think is None or isinstance(think, str)


@FUZZ
@given(text=ANY_TEXT)
def test_fuzz_xml_parse_matches_lazy_regex(text: str) -> None:
    parsed = PARSER.parse(text)
    assert parsed.think == oracle(text, ("think",))
    assert parsed.answer == oracle(text, ("answer", "final"))


@FUZZ
@given(text=ANY_TEXT)
def test_fuzz_perfect_format_means_every_field_parses(text: str) -> None:
    if PARSER.format_score(text) == 1.0:
        assert all(value is not None for value in PARSER.parse(text).as_dict().values())
    if PARSERS[3].format_score(text) == 1.0:
        assert PARSERS[3].parse_answer(text) is not None


NO_TAGS = st.text(st.characters(exclude_categories=(), exclude_characters="<"), max_size=50)


@FUZZ
@given(think=NO_TAGS, answer=NO_TAGS, stray=st.sampled_from(["<think>", "<answer>", "<final>"]))
def test_fuzz_format_round_trips_and_scores_perfect(think: str, answer: str, stray: str) -> None:
    text = PARSER.format(think=think, answer=answer)
    assert PARSER.parse(text).as_dict() == {"think": think.strip(), "answer": answer.strip()}
    assert PARSER.parse_answer(chat(text)) == answer.strip()
    assert PARSER.format_score(text) == 1.0
    assert PARSER.format_reward(chat(text, text)) == 1.0
    assert PARSER.format_score(text + stray) < 1.0
    assert PARSER.format_score(stray + text) < 1.0
    assert PARSER.format_reward(chat(text, text + stray)) < 1.0


# --- Large inputs -------------------------------------------------------------------------------


def timed(func: Callable[..., object], *args: object) -> tuple[object, float]:
    """``func(*args)`` and the seconds it took."""
    start = time.perf_counter()
    result = func(*args)
    return result, time.perf_counter() - start


def random_text(size: int, seed: int) -> str:
    """``size`` characters drawn from plain text, tag fragments, control characters and emoji."""
    rng = random.Random(seed)
    alphabet = "abc <>/\n\x00é🙂" + "".join(FRAGMENTS)
    return "".join(rng.choices(alphabet, k=size))


@pytest.mark.parametrize(
    "text",
    [
        random_text(1_000_000, seed=0),
        "<answer>" * 100_000,
        "<think>" * 100_000 + "<final>" * 100_000,
        "<answer>" * 50_000 + "x" + "</answer>" * 50_000,
        "<" * 1_000_000,
        "<answer" * 100_000 + ">",
    ],
    ids=["random-1MB", "unclosed", "unclosed-mixed", "nested", "brackets", "half-tags"],
)
def test_large_inputs_are_fast_and_safe(text: str) -> None:
    for parser in PARSERS:
        methods = (parser.parse, parser.parse_answer, parser.format_score, parser.format_reward)
        for method in methods:
            _, seconds = timed(method, text)
            assert seconds < TIME_BUDGET_S, (parser, method.__name__, seconds)
        if type(parser) is not Parser:
            assert parser.format_score(text) < 1.0


def test_large_input_results() -> None:
    unclosed = "<answer>" * 100_000
    assert PARSER.parse(unclosed).answer is None
    assert PARSER.format_score(unclosed) == 0.0
    nested = "<answer>" * 50_000 + "x" + "</answer>" * 50_000
    assert PARSER.parse(nested).answer == "<answer>" * 49_999 + "x"
    assert PARSER.format_score(nested) == 0.0
    big = random_text(1_000_000, seed=1).replace("<", "") + "<answer>42</answer>"
    answer, seconds = timed(PARSER.parse_answer, big)
    assert answer == "42"
    assert seconds < TIME_BUDGET_S
    assert ThinkParser().parse("<think>" + big + "</think> 7") == "7"
