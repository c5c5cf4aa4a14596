"""JudgeRubric: an LLM judge scored through scripted clients and over HTTP against the fake server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import palaestra as pa
from palaestra.judge import DEFAULT_PROMPT, JudgeError, JudgeRubric, yes_no
from palaestra.testing import FakeOpenAIServer

TEMPLATE = "Q: {question}\nA: {answer}\nR: {response}"
ROWS = [{"question": "2+2?", "answer": "4"}, {"question": "capital of France?", "answer": "Paris"}]


def fields(text: str) -> dict[str, str]:
    """The question/answer/response a judge got in a ``TEMPLATE`` prompt."""
    return dict(zip("QAR", (line[3:] for line in text.split("\n")), strict=True))


def graded(verdicts: dict[str, str] | None = None, *, delay: float = 0.0, log: list | None = None):
    """A scripted judge: "yes" if the response equals the answer, else "no"; ``verdicts`` maps a
    response to a reply of its own. It logs each request and waits ``delay`` (to overlap calls)."""
    live = [0, 0]  # in flight now, most at once

    async def judge(messages: list[dict[str, Any]]) -> str:
        seen = fields(messages[-1]["content"])
        if log is not None:
            log.append(seen)
        live[0] += 1
        live[1] = max(live)
        await asyncio.sleep(delay)
        live[0] -= 1
        if verdicts and seen["R"] in verdicts:
            return verdicts[seen["R"]]
        return "Yes." if seen["R"] == seen["A"] else "no"

    client = pa.ScriptedClient(judge, model="judge-model")
    client.live = live  # type: ignore[attr-defined]
    return client


def answering(replies: dict[str, list[str]]) -> pa.ScriptedClient:
    """A policy answering rollout i of a question with ``replies[question][i]`` (by call order)."""
    counts: dict[str, int] = {}

    def policy(messages: list[dict[str, Any]]) -> str:
        q = messages[-1]["content"]
        i = counts[q] = counts.get(q, -1) + 1
        return replies[q][i % len(replies[q])]

    return pa.ScriptedClient(policy)


async def run(rubric: pa.Rubric, replies: dict[str, list[str]], rows=ROWS, **env: Any) -> list[pa.Rollout]:
    n = len(next(iter(replies.values())))
    spec = pa.RunSpec(rollouts_per_example=n, max_concurrent=1)  # policy replies in a fixed order
    return await pa.SingleTurnEnv(dataset=rows, rubric=rubric, **env).run(answering(replies), spec)


def test_yes_no_verdict_is_case_and_punctuation_tolerant() -> None:
    replies = ("yes", "Yes.", "**NO**", ' "no", because', "<think>no?</think> YES")
    assert [yes_no(r) for r in replies] == [1.0, 1.0, 0.0, 0.0, 1.0]
    for reply in ("maybe", "The answer is yes", "yesno!", "", "<think>yes</think>"):
        with pytest.raises(JudgeError, match="no yes/no verdict") as err:
            yes_no(reply)
        assert repr(reply)[:20] in str(err.value)


def test_prompt_template_must_use_response_and_known_fields_only() -> None:
    client = graded()
    for bad in ("{question} {answer}", "{response} {context}", "{response} {}"):
        with pytest.raises(ValueError, match="judge prompt"):
            JudgeRubric(client=client, prompt=bad)
    JudgeRubric(client=client, prompt="just {response}")  # the others are optional
    with pytest.raises(ValueError, match="max_concurrent"):
        JudgeRubric(client=client, max_concurrent=0)


async def test_yes_no_verdicts_score_an_environment_end_to_end() -> None:
    log: list[dict[str, str]] = []
    judge = JudgeRubric(client=graded(log=log), prompt=TEMPLATE)
    rollouts = await run(judge, {"2+2?": ["4", "5"], "capital of France?": ["Lyon", "Paris"]})
    assert [r.reward for r in rollouts] == [1.0, 0.0, 0.0, 1.0]
    assert [r.metrics for r in rollouts] == [{"judge": v} for v in (1.0, 0.0, 0.0, 1.0)]
    assert all(r.error is None for r in rollouts)
    assert sorted(map(tuple, (e.values() for e in log))) == [
        ("2+2?", "4", "4"),
        ("2+2?", "4", "5"),
        ("capital of France?", "Paris", "Lyon"),
        ("capital of France?", "Paris", "Paris"),
    ]
    assert (judge.judge_calls, judge.cache_hits) == (4, 0)


async def test_identical_judgements_share_one_call_even_in_flight_together() -> None:
    judge_client = graded(delay=0.05)
    judge = JudgeRubric(client=judge_client, prompt=TEMPLATE)
    rollouts = await run(judge, {"2+2?": ["4", "4", "4", "5"]}, rows=ROWS[:1])
    assert [r.reward for r in rollouts] == [1.0, 1.0, 1.0, 0.0]
    assert (judge.judge_calls, judge.cache_hits) == (2, 2)
    assert judge_client.live[1] == 2  # the group's two distinct judgements ran at once
    # a later run reuses the values; the environment's copy of the rubric shares the cache
    env = pa.SingleTurnEnv(dataset=ROWS[:1], rubric=judge)
    again = await env.run(answering({"2+2?": ["5"]}), pa.RunSpec(rollouts_per_example=3))
    assert [r.reward for r in again] == [0.0, 0.0, 0.0]
    assert (judge.judge_calls, judge.cache_hits) == (2, 5)
    assert (env.rubric.judge_calls, env.rubric.cache_hits) == (2, 5)  # type: ignore[attr-defined]
    judge.clear_cache()
    await env.run(answering({"2+2?": ["5"]}), pa.RunSpec())
    assert judge.judge_calls == 3


async def test_max_concurrent_bounds_judge_requests_in_flight() -> None:
    judge_client = graded(delay=0.02)
    judge = JudgeRubric(client=judge_client, prompt=TEMPLATE, max_concurrent=2)
    rollouts = await run(judge, {"2+2?": ["1", "2", "3", "4", "5"]}, rows=ROWS[:1])
    assert [r.reward for r in rollouts] == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert judge_client.live[1] == 2 and judge.judge_calls == 5


async def test_unparseable_or_empty_verdict_is_a_scoring_error_not_zero() -> None:
    log: list[dict[str, str]] = []
    client = graded({"dunno": "Maybe, hard to say", "blank": "  "}, log=log)
    judge = JudgeRubric(client=client, prompt=TEMPLATE)
    replies = {"2+2?": ["4", "dunno", "blank", "5"]}
    rollouts = await run(judge, replies, rows=ROWS[:1])
    assert [r.reward for r in rollouts] == [1.0, None, None, 0.0]
    for rollout, expected in zip(rollouts[1:3], ("'Maybe, hard to say'", "empty reply"), strict=True):
        assert rollout.error is not None and rollout.error.stage == "scoring"
        assert rollout.error.type == "JudgeError"
        assert rollout.error.message.startswith("in judge: judge 'judge-model'")
        assert expected in rollout.error.message
        assert "judge" not in rollout.metrics
    # errors are not cached: scoring the same responses again asks the judge again
    calls = judge.judge_calls
    await run(judge, replies, rows=ROWS[:1])
    assert judge.judge_calls == calls + 2 and len(log) == 6


async def test_custom_verdict_parser_scores_out_of_ten() -> None:
    def out_of_ten(reply: str) -> float:
        return int(reply.split("/")[0]) / 10

    client = pa.ScriptedClient(
        lambda messages: {"4": "9/10", "5": "2/10"}.get(fields(messages[-1]["content"])["R"], "?")
    )
    judge = JudgeRubric(client=client, prompt=TEMPLATE, verdict=out_of_ten, name="score")
    rollouts = await run(judge, {"2+2?": ["4", "5", "four"]}, rows=ROWS[:1])
    assert [r.reward for r in rollouts] == [0.9, 0.2, None]
    assert rollouts[0].metrics == {"score": 0.9}
    error = rollouts[2].error
    assert error is not None and error.message.startswith("in score: judge 'scripted': ValueError")
    assert "reply '?'" in error.message


async def test_judge_composes_with_weights_other_functions_and_rubric_groups() -> None:
    def short(completion) -> float:
        return 1.0 if len(completion[-1]["content"]) <= 2 else 0.0

    judge = JudgeRubric(client=graded(), prompt=TEMPLATE, weight=2.0)
    judge.add(short, 0.5)
    replies = {"2+2?": ["4", "5", "four"]}
    rollouts = await run(judge, replies, rows=ROWS[:1])
    assert [r.reward for r in rollouts] == [2.5, 0.5, 0.0]
    assert rollouts[0].metrics == {"judge": 1.0, "short": 1.0}

    group = pa.RubricGroup(
        [JudgeRubric(client=graded(), prompt=TEMPLATE, name="j"), pa.Rubric([short], [0.5])]
    )
    rollouts = await run(group, replies, rows=ROWS[:1])
    assert [r.reward for r in rollouts] == [1.5, 0.5, 0.0]


async def test_response_is_the_parsed_answer_and_question_hook_reads_a_column() -> None:
    log: list[dict[str, str]] = []
    judge = JudgeRubric(client=graded(log=log), prompt=TEMPLATE, question=lambda question: f"<{question}>")
    replies = {"Think, then answer in <answer> tags.\n2+2?": ["<think>hmm</think><answer>4</answer>", "4"]}
    rows = [{"prompt": next(iter(replies)), "question": "2+2?", "answer": 4}]
    rollouts = await run(judge, replies, rows=rows, parser=pa.XMLParser(["think", "answer"]))
    assert [r.reward for r in rollouts] == [1.0, 1.0]  # no <answer> tag: the reply's text is judged
    assert log[0] == {"Q": "<2+2?>", "A": "4", "R": "4"}
    assert (judge.judge_calls, judge.cache_hits) == (1, 1)

    with pytest.raises(pa.BindingError, match=r"judge.*'missing'"):
        pa.SingleTurnEnv(dataset=rows, rubric=JudgeRubric(client=graded(), question=lambda missing: missing))


async def test_default_prompt_over_http_records_the_filled_template() -> None:
    async with FakeOpenAIServer(lambda body: "Yes", model="fake-judge") as server:
        async with pa.OpenAIClient("fake-judge", base_url=server.base_url) as client:
            judge = JudgeRubric(client=client, max_concurrent=4)
            rollouts = await run(judge, {"2+2?": ["It is 4.", "4"]}, rows=ROWS[:1], system_prompt="Be brief.")
    assert [r.reward for r in rollouts] == [1.0, 1.0]
    assert len(server.requests) == 2
    first = DEFAULT_PROMPT.format(question="2+2?", answer="4", response="It is 4.")
    assert {r["messages"][0]["content"] for r in server.requests} == {
        first,
        DEFAULT_PROMPT.format(question="2+2?", answer="4", response="4"),
    }
    assert all(len(r["messages"]) == 1 and r["messages"][0]["role"] == "user" for r in server.requests)
    assert "Question:\n2+2?\n\nReference answer:\n4\n\nResponse:\nIt is 4." in first
    assert all(
        r["model"] == "fake-judge" and r["temperature"] == 0 and r["max_tokens"] == 16
        for r in server.requests
    )


@pytest.mark.parametrize(
    ("fault", "message", "requests"), [("status", "HTTP 500", 4), ("malformed", "BadResponseError", 3)]
)
async def test_server_faults_are_scoring_errors_and_the_rest_of_the_group_is_scored(
    fault: str, message: str, requests: int
) -> None:
    def reply(body: dict[str, Any]) -> Any:
        response = fields(body["messages"][0]["content"])["R"]
        return {"fault": fault, "status": 500} if response == "boom" else "no"

    async with FakeOpenAIServer(reply, model="fake-judge") as server:
        options = {"max_retries": 1, "backoff": 0.01, "max_backoff": 0.02, "timeout": 2.0}
        async with pa.OpenAIClient("fake-judge", base_url=server.base_url, **options) as client:
            judge = JudgeRubric(client=client, prompt=TEMPLATE)
            rollouts = await run(judge, {"2+2?": ["1", "boom", "boom", "3"]}, rows=ROWS[:1])
    assert [r.reward for r in rollouts] == [0.0, None, None, 0.0]
    for failed in rollouts[1:3]:
        assert (
            failed.error is not None and failed.error.stage == "scoring" and failed.error.type == "JudgeError"
        )
        assert failed.error.message.startswith("in judge: judge 'fake-judge' request failed")
        assert message in failed.error.message
    # the two "boom" judgements shared one call (a 500 is retried once by the client)
    assert judge.judge_calls == 3 and len(server.requests) == requests


async def test_groups_in_flight_at_once_share_a_call_also_through_a_rubric_group() -> None:
    judge_client = graded(delay=0.05)
    judge = JudgeRubric(client=judge_client, prompt=TEMPLATE)
    rows = [ROWS[0]] * 3  # three examples, so three groups, judged at the same time
    env = pa.SingleTurnEnv(dataset=rows, rubric=pa.RubricGroup([judge]))
    rollouts = await env.run(answering({"2+2?": ["4"]}), pa.RunSpec())
    assert [r.reward for r in rollouts] == [1.0, 1.0, 1.0]
    assert (judge.judge_calls, judge.cache_hits, judge_client.live[1]) == (1, 2, 1)
