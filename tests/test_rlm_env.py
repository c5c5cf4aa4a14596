"""pa.RLMEnv: the context lives in the REPL, never in the prompt; llm_query reaches a model over a
Unix socket bound into the sandbox, within its limits; FINAL gives the answer; sub-call tokens count."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import palaestra as pa
from palaestra.repl import live_workers
from palaestra.testing.repl import code_policy, python_call, sandbox_problem, sandbox_processes

PROBLEM = sandbox_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"no bubblewrap sandbox here: {PROBLEM}")
DOCUMENT = "".join(f"line {i}: the value is {i * 7}\n" for i in range(5000))
LIMITS = {"call_seconds": 5.0, "output_chars": 500}


def sub_model(messages: pa.Messages) -> str:
    """Answers 'UPPER: text' prompts with the text in capitals."""
    return str(messages[-1]["content"]).removeprefix("UPPER: ").upper()


def rlm(**kwargs: Any) -> pa.RLMEnv:
    kwargs.setdefault("sub_client", pa.ScriptedClient(sub_model))
    kwargs.setdefault("limits", LIMITS)
    return pa.RLMEnv(
        dataset=[{"question": "What is the value on line 4321?", "context": DOCUMENT, "answer": "30247"}],
        **kwargs,
    )


def tools(rollout: pa.Rollout) -> list[str]:
    return [str(m["content"]) for m in rollout.completion if m["role"] == "tool"]


async def test_the_context_is_a_variable_and_never_in_the_prompt() -> None:
    env = rlm()
    prompt = json.dumps(env.examples[0].prompt)
    assert "line 4321:" not in prompt and "`context` is a str of 147,301 characters." in prompt
    code = "import re\nFINAL(re.search(r'line 4321: the value is (\\d+)', context).group(1))"
    [rollout] = await env.run(pa.ScriptedClient(code_policy("len(context)", code)))
    assert tools(rollout)[0] == "[value]\n147301"
    assert rollout.state["final_answer"] == "30247" and rollout.stop_reason == "final_answer"
    assert live_workers() == 0 and not sandbox_processes()


async def test_llm_query_reaches_the_sub_model_and_its_tokens_are_counted() -> None:
    code = (
        "print(llm_query('UPPER: hello'))\n"
        "print(llm_query_batched(['UPPER: a b', 'UPPER: c', 'UPPER: d e f']))\n"
        "import os\nprint(sorted(os.listdir('/run/palaestra')))"
    )
    [rollout] = await rlm().run(pa.ScriptedClient(code_policy(code, answer="FINAL(done)")))
    assert tools(rollout)[0] == "HELLO\n['A B', 'C', 'D E F']\n['llm.sock']"
    assert rollout.metrics["sub_calls"] == 4 and rollout.metrics["sub_errors"] == 0
    # ScriptedClient counts words: 2 + 3 + 2 + 4 prompt words, 1 + 2 + 1 + 3 completion words
    assert rollout.metrics["sub_prompt_tokens"] == 11 and rollout.metrics["sub_completion_tokens"] == 7
    own = sum(t.usage.completion_tokens for t in rollout.turns)
    assert rollout.usage.completion_tokens == own + 7  # the rollout's usage holds the sub-calls
    assert rollout.state["final_answer"] == "done"  # FINAL(...) written in a reply without tool calls
    assert len(rollout.completion) == 3  # the sub-calls are not the rollout's messages: never trained on


async def test_the_rollouts_own_client_answers_when_no_sub_model_is_given() -> None:
    def policy(messages: pa.Messages) -> Any:
        if len(messages) == 1:  # a sub-call: one user message
            return "sub says " + str(messages[0]["content"])
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return {"content": "", "tool_calls": [python_call("FINAL(llm_query('hi'))")]} if turn == 0 else "x"

    [rollout] = await rlm(sub_client=None).run(pa.ScriptedClient(policy))
    assert rollout.state["final_answer"] == "sub says hi" and rollout.metrics["sub_calls"] == 1


async def test_sub_calls_past_their_limits_are_errors_the_model_reads() -> None:
    env = rlm(max_sub_calls=3, max_batch=2, max_prompt_chars=50)
    codes = (
        "llm_query_batched(['UPPER: a', 'UPPER: b', 'UPPER: c'])",
        "llm_query('x' * 51)",
        "llm_query_batched(['UPPER: a', 'UPPER: b'])",
        "llm_query_batched(['UPPER: c', 'UPPER: d'])",
        "llm_query(42)",
        "llm_query('UPPER: still works')",
    )
    [rollout] = await env.run(pa.ScriptedClient(code_policy(*codes)))
    batch, long, ok, over, wrong, last = tools(rollout)
    assert "RuntimeError: llm_query_batched: at most 2 prompts at once, not 3" in batch
    assert "a prompt may hold 50 characters; one has 51" in long
    assert ok == "[value]\n['A', 'B']"
    assert "this rollout may make 3 sub-calls and has 1 left" in over
    assert "TypeError: llm_query_batched takes a list of strings" in wrong
    assert last == "[value]\n'STILL WORKS'"
    assert rollout.error is None and rollout.metrics["sub_calls"] == 3


async def test_a_failing_or_hanging_sub_model_never_hangs_the_rollout() -> None:
    async def hangs(messages: pa.Messages) -> str:
        if "hang" in str(messages[-1]["content"]):
            await asyncio.sleep(60)
        raise pa.ModelHTTPError(500, "the sub-model is down")

    env = rlm(sub_client=pa.ScriptedClient(hangs), limits={"call_seconds": 1.0})
    [rollout] = await env.run(
        pa.ScriptedClient(code_policy("llm_query('fail')", "llm_query('hang')", "1 + 1"))
    )
    failed, hung, after = tools(rollout)
    assert "llm_query: the sub-model failed: ModelHTTPError: HTTP 500: the sub-model is down" in failed
    assert "ran past its 1 s of wall time and was killed" in hung
    assert after.endswith("[value]\n2") and rollout.error is None
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()] == []
    assert live_workers() == 0 and not sandbox_processes()


async def test_a_list_context_and_bad_rows() -> None:
    env = pa.RLMEnv(dataset=[{"question": "How many?", "context": ["ab", "cde"]}], limits=LIMITS)
    assert "`context` is a list of 2 str (5 characters in all)." in env.examples[0].prompt[-1]["content"]
    [rollout] = await env.run(pa.ScriptedClient(code_policy("FINAL(len(context))")))
    assert rollout.state["final_answer"] == "2"
    with pytest.raises(pa.DatasetError, match="row 0: 'context' must be a string or a list of strings"):
        pa.RLMEnv(dataset=[{"question": "q", "context": 3}])
    with pytest.raises(ValueError, match="max_sub_calls must be an integer ≥ 1"):
        rlm(max_sub_calls=0)


async def test_with_depth_2_a_sub_call_is_an_rlm_rollout_of_its_own() -> None:
    def policy(messages: pa.Messages) -> Any:
        if len(messages) == 1:  # a plain sub-call (depth 2): one user message
            return "plain: " + str(messages[0]["content"])
        nested = "Answer the request that is the variable `context`" in str(messages[1]["content"])
        if messages[-1]["role"] == "tool":
            return "not reached"
        code = "FINAL(context.upper() + ' / ' + llm_query('leaf'))" if nested else "FINAL(llm_query('deep'))"
        return {"content": "", "tool_calls": [python_call(code)]}

    env = rlm(sub_client=None, max_depth=2, max_sub_calls=2)
    [rollout] = await env.run(pa.ScriptedClient(policy))
    assert rollout.state["final_answer"] == "DEEP / plain: leaf"  # the nested RLM read its context in a REPL
    assert rollout.metrics["sub_calls"] == 2  # the root's and the nested rollout's, from one budget
    own = sum(t.usage.completion_tokens for t in rollout.turns)
    assert rollout.usage.completion_tokens > own  # the nested rollout's turns count in the root's usage
    assert len(rollout.completion) == 2 and live_workers() == 0 and not sandbox_processes()
    [capped] = await rlm(sub_client=None, max_depth=2, max_sub_calls=1).run(pa.ScriptedClient(policy))
    # the nested rollout's llm_query found the root's budget spent; it replied without a FINAL
    assert capped.state["final_answer"] == "not reached"
    assert capped.metrics["sub_calls"] == 1 and capped.metrics["sub_errors"] == 1
