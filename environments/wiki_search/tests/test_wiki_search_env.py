"""The environment end to end: scripted tool calls over real HTTP, a judge, and the scripted policy."""

from __future__ import annotations

import json
from typing import Any

import pytest
import wiki_search as ws
from wiki_search.policies import answer_kind, extract

import palaestra as pa
from palaestra.testing import FakeOpenAIServer

# The measured accuracy of `searcher` on all questions (README "Scripted baseline"): a floor.
SEARCHER_CORRECT = 41
SEARCHER_READ_GOLD = 51


def call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


TURNS = [
    [  # four calls in one turn: two good ones, arguments that are not JSON, a tool that does not exist
        call("search_pages", {"query": "assert statement exception"}, "a0"),
        call("view_sections", {"page_id": "assert"}, "a1"),
        call("read_section", '{"section_id": "assert:the-assert', "a2"),
        call("browse", {"url": "https://docs.python.org"}, "a3"),
    ],
    [
        call("read_section", {"section_id": "assert:the-assert-statement"}, "b0"),
        call("view_sections", {"page": "assert"}, "b1"),  # a wrong argument name
        call("view_sections", {"page_id": "asert"}, "b2"),  # an unknown page
    ],
]
ANSWERS = {  # the first two questions: a right answer, written loosely, and a wrong one
    ws.QUESTIONS[0].question: "It is <answer>`AssertionError`</answer>.",
    ws.QUESTIONS[1].question: "<answer>True</answer>",
}


def reply(body: dict[str, Any]) -> Any:
    """The policy model: the scripted turns, then the answer to the conversation's question."""
    made = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if made < len(TURNS):
        return {"content": None, "tool_calls": TURNS[made]}
    question = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return ANSWERS[question]


def client_for(server: FakeOpenAIServer) -> pa.OpenAIClient:
    return pa.OpenAIClient(server.model, base_url=server.base_url, timeout=5.0, max_retries=0)


async def test_tool_calls_over_http_scored_by_exact_match() -> None:
    env = ws.load_environment()
    async with FakeOpenAIServer(reply) as server:
        async with client_for(server) as client:
            rollouts = await env.run(client, pa.RunSpec(num_examples=2))
    right, wrong = rollouts
    assert [r.error for r in rollouts] == [None, None]
    assert [r.stop_reason for r in rollouts] == ["no_tool_calls"] * 2
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    assert right.metrics["exact_match"] == 1.0 and right.metrics["read_gold_section"] == 1.0
    assert right.metrics["answer_format"] == 1.0
    assert wrong.metrics["read_gold_section"] == 1.0  # the evidence of question 1 is in that section too
    assert right.metrics["tool_calls"] == 7 and right.metrics["tool_errors"] == 4
    assert right.metrics["search_pages_calls"] == 1 and right.metrics["read_section_calls"] == 2
    assert right.metrics["read_section_errors"] == 1 and right.metrics["view_sections_errors"] == 2

    first = right.completion[1:5]  # the results of the first turn, in call order
    assert [m["tool_call_id"] for m in first] == ["a0", "a1", "a2", "a3"]
    assert first[0]["content"].startswith("5 pages for 'assert statement exception':\n1. page_id: assert |")
    assert first[1]["content"].startswith('Page assert: The "assert" statement (1 sections)')
    assert first[2]["content"].startswith("Error: the arguments are not valid JSON")
    assert (
        first[3]["content"]
        == "Error: unknown tool 'browse'; the tools are: search_pages, view_sections, read_section."
    )
    second = right.completion[6:9]
    assert second[0]["content"].startswith('Section assert:the-assert-statement (The "assert" statement)\n\n')
    assert (
        second[1]["content"]
        == "Error: invalid arguments for view_sections: missing required argument 'page_id'; unknown argument 'page'"
    )
    assert second[2]["content"] == (
        "Error: view_sections raised NotFound: no page has the id 'asert'; page ids come from "
        "search_pages. Did you mean 'assert', 'raise'?"
    )
    # the requests carried the tools' schemas, the system prompt and every tool result
    assert [t["function"]["name"] for t in server.requests[0]["tools"]] == [
        "search_pages",
        "view_sections",
        "read_section",
    ]
    assert server.requests[0]["messages"][0] == {"role": "system", "content": ws.SYSTEM_PROMPT}
    last = [b for b in server.requests if b["messages"][1]["content"] == ws.QUESTIONS[0].question][-1]
    assert [m["role"] for m in last["messages"]] == [
        "system",
        "user",
        "assistant",
        *["tool"] * 4,
        "assistant",
        *["tool"] * 3,
    ]


async def test_a_judge_served_over_http_gives_the_reward() -> None:
    prompts: list[str] = []

    def judge(body: dict[str, Any]) -> str:
        prompt = body["messages"][-1]["content"]
        prompts.append(prompt)
        reference = prompt.split("Reference answer:\n")[1].split("\n")[0]
        response = prompt.split("Response:\n")[1].split("\n\nDoes the response")[0]
        return "Yes." if reference.lower() in response.lower() else "No."

    answers = {
        ws.QUESTIONS[
            0
        ].question: "<answer>the AssertionError exception</answer>",  # judged right, no exact match
        ws.QUESTIONS[1].question: "<answer>True</answer>",
    }

    def policy(body: dict[str, Any]) -> Any:
        question = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if not any(m["role"] == "tool" for m in body["messages"]):
            return {
                "content": None,
                "tool_calls": [call("read_section", {"section_id": "assert:the-assert-statement"}, "r0")],
            }
        return answers[question]

    async with (
        FakeOpenAIServer(judge, model="fake-judge") as judge_server,
        FakeOpenAIServer(policy) as server,
    ):
        env = ws.load_environment(judge_model="fake-judge", judge_base_url=judge_server.base_url)
        assert isinstance(env.rubric, pa.JudgeRubric)
        async with client_for(server) as client, env:
            rollouts = await env.run(client, pa.RunSpec(num_examples=2))
        assert env.judge_client is not None and env.judge_client._session is None  # closed by aclose
    assert [r.error for r in rollouts] == [None, None]
    assert [r.reward for r in rollouts] == [1.0, 0.0]
    assert [r.metrics["judge"] for r in rollouts] == [1.0, 0.0]
    assert [r.metrics["exact_match"] for r in rollouts] == [0.0, 0.0]  # a metric only, with a judge
    assert [r.metrics["read_gold_section"] for r in rollouts] == [1.0, 1.0]
    assert len(prompts) == 2 and judge_server.requests[0]["model"] == "fake-judge"
    assert (
        f"Question:\n{ws.QUESTIONS[0].question}\n" in prompts[0]
        or f"Question:\n{ws.QUESTIONS[0].question}\n" in prompts[1]
    )


def test_load_environment_arguments() -> None:
    env = pa.load_environment("wiki_search", split="eval", max_turns=4)
    assert isinstance(env, ws.WikiSearchEnv) and env.max_turns == 4
    assert [e.answer for e in env.examples] == [r["answer"] for r in ws.rows("eval")]
    assert env.examples[0].info["section_id"] == ws.QUESTIONS[4].section_id
    assert env.rubric.names == ["exact_match", "read_gold_section", "answer_format"]
    assert env.rubric.weights == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="split must be one of train, eval, all"):
        ws.load_environment(split="test")
    with pytest.raises(ValueError, match="max_turns"):
        ws.load_environment(max_turns=0)


def test_a_remote_judge_without_a_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WIKI_SEARCH_TEST_KEY", raising=False)
    with pytest.raises(pa.ClientConfigError, match="WIKI_SEARCH_TEST_KEY"):
        ws.load_environment(judge_model="gpt-x", judge_api_key_var="WIKI_SEARCH_TEST_KEY")


async def test_the_scripted_searcher_meets_its_measured_accuracy() -> None:
    env = ws.load_environment(split="all")
    rollouts = await env.run(pa.ScriptedClient(ws.searcher), pa.RunSpec())
    assert [r.error for r in rollouts] == [None] * len(ws.QUESTIONS)
    assert sum(r.metrics["exact_match"] for r in rollouts) >= SEARCHER_CORRECT
    assert sum(r.metrics["read_gold_section"] for r in rollouts) >= SEARCHER_READ_GOLD
    assert all(r.metrics["tool_calls"] <= 6 and r.metrics["tool_errors"] == 0 for r in rollouts)
    assert all(r.metrics["answer_format"] == 1.0 for r in rollouts)


async def test_the_searcher_never_sees_the_answers() -> None:
    """Blank every answer and gold field: the searcher plays exactly the same replies."""
    blank = [{"question": q.question, "answer": "?", "info": {}} for q in ws.QUESTIONS]
    env = ws.load_environment(split="all")
    blind = pa.ToolEnv(
        dataset=blank, tools=list(ws.env.TOOLS), system_prompt=ws.SYSTEM_PROMPT, parser=env.parser
    )
    client = pa.ScriptedClient(ws.searcher)
    seen = await env.run(client, pa.RunSpec())
    unseen = await blind.run(client, pa.RunSpec())
    assert [r.completion for r in seen] == [r.completion for r in unseen]


def test_the_extractive_rule_on_its_own() -> None:
    assert answer_kind("In a generator function, which exception does return raise?") == "exception"
    assert answer_kind("Which special method implements round()?") == "dunder"
    assert answer_kind("Which PEP added class decorators?") == "pep"
    assert answer_kind("What is the main module called?") == "quoted"
    text = 'A "return" in a generator makes it done and raises "StopIteration". Others raise "ValueError".'
    assert extract("Which exception does return in a generator raise?", [text]) == "StopIteration"
    assert extract("Which exception does return in a generator raise?", ["no candidates here"]) is None
