"""ToolEnv and StatefulToolEnv end to end: scripted tool-calling replies from the fake OpenAI server."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

import palaestra as pa
from palaestra.testing import FakeOpenAIServer


def call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def scripted(*turns: list[dict[str, Any]], answer: str = "done") -> Any:
    """A reply function: the i-th assistant turn of a conversation makes the calls ``turns[i]``."""

    def reply(body: dict[str, Any]) -> Any:
        made = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if made < len(turns):
            return {"content": None, "tool_calls": turns[made]}
        return answer

    return reply


def client_for(server: FakeOpenAIServer) -> pa.OpenAIClient:
    return pa.OpenAIClient(server.model, base_url=server.base_url, timeout=5.0, max_retries=0)


ROWS = [{"question": "What is 2 + 3?", "answer": "5"}]
both_waiting = threading.Barrier(2, timeout=5)
threads: list[str] = []


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def wait_for_partner(label: str) -> str:
    """Only returns once a second call runs at the same time (a sync tool, in a thread)."""
    threads.append(threading.current_thread().name)
    both_waiting.wait()
    return label


async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


def broken() -> str:
    """Always fails."""
    raise KeyError("the key is missing")


class Fatal(Exception):
    pass


def fatal() -> str:
    """Fails in a way that ends the rollout."""
    raise Fatal("the sandbox is gone")


def exact(completion: list[dict[str, Any]], answer: str) -> float:
    return float((completion[-1].get("content") or "").strip() == answer)


def tool_env(**kwargs: Any) -> pa.ToolEnv:
    options: dict[str, Any] = {
        "tools": [add, wait_for_partner, slow, broken, fatal],
        "dataset": ROWS,
        "rubric": pa.Rubric([exact]),
        "tool_timeout": 0.5,
        "fatal_errors": (Fatal,),
    }
    return pa.ToolEnv(**{**options, **kwargs})


async def test_parallel_calls_run_concurrently_and_answer_in_call_order() -> None:
    threads.clear()
    first = [
        call("slow", {"seconds": 0.2}, "c0"),  # finishes last, answered first
        call("wait_for_partner", {"label": "left"}, "c1"),
        call("wait_for_partner", {"label": "right"}, "c2"),
        call("add", {"a": 2, "b": 3}, "c3"),
    ]
    async with FakeOpenAIServer(scripted(first, answer="5")) as server:
        async with client_for(server) as client:
            [rollout] = await tool_env().run(client)
    assert rollout.error is None and rollout.stop_reason == "no_tool_calls"
    results = rollout.completion[1:5]
    assert [m["tool_call_id"] for m in results] == ["c0", "c1", "c2", "c3"]
    assert [m["content"] for m in results] == ["slept 0.2", "left", "right", "5"]
    # the barrier of two only opens if both sync calls ran at once, off the event loop's thread
    assert len(threads) == 2 and all(t.startswith("palaestra-tool") for t in threads)
    assert rollout.reward == 1.0
    # the second request carried the tool calls and their results over HTTP
    second = server.requests[1]["messages"]
    assert [c["id"] for c in second[-5]["tool_calls"]] == ["c0", "c1", "c2", "c3"]
    assert second[-1] == {"role": "tool", "tool_call_id": "c3", "content": "5"}
    assert server.requests[0]["tools"] == tool_env().tools
    assert rollout.metrics["tool_calls"] == 4 and rollout.metrics["tool_errors"] == 0
    assert rollout.metrics["wait_for_partner_calls"] == 2 and rollout.metrics["broken_calls"] == 0
    assert rollout.metrics["slow_seconds"] >= 0.2


async def test_bad_calls_are_answered_with_errors_and_counted() -> None:
    first = [
        call("add", '{"a": 1, "b": ', "bad-json"),
        call("add", {"a": 1}, "missing"),
        call("add", {"a": "1", "b": 2}, "wrong-type"),
        call("subtract", {"a": 1, "b": 2}, "unknown"),
        call("broken", {}, "raises"),
        call("slow", {"seconds": 30}, "hangs"),
    ]
    async with FakeOpenAIServer(scripted(first, answer="5")) as server:
        async with client_for(server) as client:
            [rollout] = await tool_env().run(client)
    assert rollout.error is None and rollout.reward == 1.0  # the episode went on
    texts = {m["tool_call_id"]: m["content"] for m in rollout.completion if m["role"] == "tool"}
    assert texts["bad-json"].startswith("Error: the arguments are not valid JSON")
    assert texts["missing"] == "Error: invalid arguments for add: missing required argument 'b'"
    assert "a: Input should be a valid integer (got '1')" in texts["wrong-type"]
    assert texts["unknown"] == (
        "Error: unknown tool 'subtract'; the tools are: add, wait_for_partner, slow, broken, fatal."
    )
    assert texts["raises"] == "Error: broken raised KeyError: 'the key is missing'"
    assert texts["hangs"] == "Error: slow timed out after 0.5 s."
    m = rollout.metrics
    assert (m["tool_calls"], m["tool_errors"]) == (6, 6)
    assert (m["add_calls"], m["add_errors"], m["broken_errors"], m["slow_errors"]) == (3, 3, 1, 1)
    assert 0.5 <= m["slow_seconds"] < 5


async def test_a_fatal_tool_error_ends_the_rollout_with_a_recorded_error() -> None:
    async with FakeOpenAIServer(
        scripted([call("fatal", {}, "f"), call("add", {"a": 1, "b": 1}, "a")])
    ) as server:
        async with client_for(server) as client:
            [rollout] = await tool_env().run(client)
    assert rollout.stop_reason == "error" and rollout.reward is None
    assert rollout.error == pa.ErrorInfo("Fatal", "fatal raised Fatal: the sandbox is gone", "tool")
    assert rollout.metrics["fatal_calls"] == 1 and rollout.metrics["add_calls"] == 1
    assert server.request_count == 1  # no model turn after it


async def test_max_turns_caps_a_model_that_never_stops_calling() -> None:
    forever = [call("add", {"a": 1, "b": 1}, "x")]
    async with FakeOpenAIServer(scripted(*[forever] * 10)) as server:
        async with client_for(server) as client:
            [rollout] = await tool_env(max_turns=3).run(client)
    assert rollout.stop_reason == "max_turns" and len(rollout.turns) == 3
    assert rollout.metrics["add_calls"] == 3  # the last reply's calls ran too
    assert rollout.completion[-1]["role"] == "tool"


def test_tool_names_are_unique() -> None:
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        pa.ToolEnv(tools=[add, add], dataset=ROWS)


# --- StatefulToolEnv: per-rollout resources, always released ---------------------------------


class Counter:
    """A resource that knows how many of its kind are open."""

    open = 0

    def __init__(self) -> None:
        Counter.open += 1
        self.closed = False
        self.value = 0

    def close(self) -> None:
        if not self.closed:
            Counter.open -= 1
            self.closed = True


def bump(by: int, counter: Counter) -> int:
    """Add to this rollout's counter."""
    counter.value += by
    return counter.value


class CounterEnv(pa.StatefulToolEnv):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(dataset=[{"question": f"count {i}"} for i in range(4)], **kwargs)
        self.add_tool(bump, hidden=["counter"])
        self.add_tool(slow)
        self.add_tool(fatal)
        self.cleanups = 0

    async def setup_state(self, state: pa.State) -> None:
        state.resources["counter"] = Counter()

    async def cleanup_state(self, state: pa.State) -> None:
        self.cleanups += 1
        counter = state.resources.pop("counter", None)
        if counter is not None:
            state["final"] = counter.value
            counter.close()


async def test_hidden_arguments_come_from_the_rollouts_own_resources() -> None:
    Counter.open = 0
    env = CounterEnv()
    assert env.tools is not None
    bump_schema = next(t for t in env.tools if t["function"]["name"] == "bump")
    assert bump_schema["function"]["parameters"]["properties"].keys() == {"by"}
    turns = [[call("bump", {"by": 2}, "a"), call("bump", {"by": 3}, "b")], [call("bump", {"by": 1}, "c")]]
    async with FakeOpenAIServer(scripted(*turns)) as server:
        async with client_for(server) as client:
            rollouts = await env.run(client, pa.RunSpec(rollouts_per_example=2))
    assert all(r.error is None for r in rollouts)
    assert [r.state["final"] for r in rollouts] == [6] * 8  # each rollout its own counter
    assert env.cleanups == 8 and Counter.open == 0
    # a model that tries to pass the hidden argument is refused
    sneaky = [[call("bump", {"by": 1, "counter": 5}, "s")]]
    async with FakeOpenAIServer(scripted(*sneaky)) as server:
        async with client_for(server) as client:
            [rollout] = await env.run(client, pa.RunSpec(num_examples=1))
    assert "unknown argument 'counter'" in rollout.completion[1]["content"]
    assert Counter.open == 0


async def test_resources_are_released_on_errors_timeouts_and_cancellation() -> None:
    Counter.open = 0
    async with FakeOpenAIServer(scripted([call("fatal", {}, "f")])) as server:
        async with client_for(server) as client:
            env = CounterEnv(fatal_errors=(Fatal,))
            failed = await env.run(client, pa.RunSpec(num_examples=2))
    assert all(r.error is not None and r.error.stage == "tool" for r in failed)
    assert Counter.open == 0 and env.cleanups == 2

    async with FakeOpenAIServer(scripted([call("slow", {"seconds": 0.4}, "s")])) as server:
        async with client_for(server) as client:
            timed = await CounterEnv(tool_timeout=10, timeout=0.2).run(client, pa.RunSpec(num_examples=2))
    assert [r.stop_reason for r in timed] == ["timeout", "timeout"]
    assert Counter.open == 0

    async with FakeOpenAIServer(scripted([call("slow", {"seconds": 30}, "s")])) as server:
        async with client_for(server) as client:
            env = CounterEnv(tool_timeout=60)
            task = asyncio.create_task(env.run(client, pa.RunSpec(rollouts_per_example=3)))
            while Counter.open < 12:  # every rollout is inside its tool call
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert Counter.open == 0 and env.cleanups == 12


async def test_a_failing_setup_or_cleanup_is_recorded_and_still_cleaned() -> None:
    class Flaky(CounterEnv):
        async def setup_state(self, state: pa.State) -> None:
            await super().setup_state(state)
            if state.example.id == 1:
                raise OSError("disk full")

        async def cleanup_state(self, state: pa.State) -> None:
            await super().cleanup_state(state)
            if state.example.id == 2:
                raise RuntimeError("could not release")

    Counter.open = 0
    async with FakeOpenAIServer(scripted()) as server:
        async with client_for(server) as client:
            rollouts = await Flaky().run(client, pa.RunSpec(num_examples=3))
    assert rollouts[0].error is None
    assert rollouts[1].error == pa.ErrorInfo("OSError", "in setup_state: disk full", "env")
    assert rollouts[2].error == pa.ErrorInfo("RuntimeError", "in cleanup_state: could not release", "env")
    assert Counter.open == 0


def test_a_missing_resource_is_an_environment_error() -> None:
    class Forgetful(CounterEnv):
        async def setup_state(self, state: pa.State) -> None:
            pass

    async def go() -> pa.Rollout:
        async with FakeOpenAIServer(scripted([call("bump", {"by": 1}, "a")])) as server:
            async with client_for(server) as client:
                return (await Forgetful().run(client, pa.RunSpec(num_examples=1)))[0]

    rollout = asyncio.run(go())
    assert rollout.error is not None and rollout.error.stage == "env"
    assert "needs state.resources ['counter'], which setup_state did not set" in rollout.error.message
