"""Tools that misbehave: whatever they raise is their error, never the run's; what they return is capped."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.tools import DEFAULT_MAX_RESULT_CHARS


def calls(*names: str, arguments: str = "{}") -> dict[str, Any]:
    turn = [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
        for i, name in enumerate(names)
    ]
    return {"content": None, "tool_calls": turn}


def first_turn(*names: str, arguments: str = "{}") -> pa.ScriptedClient:
    """A model that calls ``names`` at once, then answers "done"."""
    return pa.ScriptedClient(
        lambda messages: calls(*names, arguments=arguments) if len(messages) == 1 else "done"
    )


def tool_texts(rollout: pa.Rollout) -> list[str]:
    return [m["content"] for m in rollout.completion if m["role"] == "tool"]


# --- whatever a tool raises ------------------------------------------------------------------

HOSTILE_TOOLS = '''
import asyncio
import sys

import palaestra as pa


class Odd(BaseException):
    pass


class Unprintable(Exception):
    def __str__(self):
        raise SystemExit("from __str__")


def exit_sync() -> str:
    """Exit the process."""
    raise SystemExit(3)


async def exit_async() -> str:
    """Exit the process, from the event loop."""
    sys.exit(3)


def interrupt() -> str:
    """As if Ctrl-C were pressed."""
    raise KeyboardInterrupt


async def generator_exit() -> str:
    """A GeneratorExit out of nowhere."""
    raise GeneratorExit


def odd() -> str:
    """A BaseException of its own."""
    raise Odd("odd")


def stop_iteration() -> str:
    """A StopIteration, which an asyncio future cannot hold."""
    raise StopIteration("done")


async def cancelled() -> str:
    """A CancelledError although nothing cancels the rollout."""
    raise asyncio.CancelledError


def unprintable() -> str:
    """An exception whose message raises."""
    raise Unprintable()


NAMES = ["exit_sync", "exit_async", "interrupt", "generator_exit", "odd", "stop_iteration", "cancelled", "unprintable"]


def policy(messages):
    if len(messages) > 1:
        return "done"
    turn = [{"id": n, "type": "function", "function": {"name": n, "arguments": "{}"}} for n in NAMES]
    return {"content": None, "tool_calls": turn}


class Stateful(pa.StatefulToolEnv):
    async def setup_state(self, state):
        state.resources["n"] = 1


async def main(out):
    tools = [globals()[n] for n in NAMES]
    rows = [{"question": f"q{i}"} for i in range(3)]
    for cls in (pa.ToolEnv, Stateful):
        env = cls(tools=tools, dataset=rows, tool_timeout=5)
        spec = pa.RunSpec(num_examples=3, rollouts_per_example=2)
        await pa.evaluate(env, pa.ScriptedClient(policy, model=cls.__name__), spec, output_dir=out)
    print("finished")


asyncio.run(main(sys.argv[1]))
'''


def test_an_eval_run_survives_tools_that_raise_anything_and_saves_every_rollout(tmp_path: Path) -> None:
    script = tmp_path / "hostile_tools.py"
    script.write_text(textwrap.dedent(HOSTILE_TOOLS))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "finished", done.stderr[-3000:]
    runs = sorted((tmp_path / "out" / "evals").glob("*/*"))
    assert len(runs) == 2  # a ToolEnv and a StatefulToolEnv
    for path in runs:
        run = pa.load_run(path)
        assert run.metadata.status == "complete" and len(run.rollouts) == 6
        for rollout in run.rollouts:
            assert rollout.error is None and rollout.stop_reason == "no_tool_calls"
            assert tool_texts(rollout) == [
                "Error: exit_sync raised SystemExit: 3",
                "Error: exit_async raised SystemExit: 3",
                "Error: interrupt raised KeyboardInterrupt",
                "Error: generator_exit raised GeneratorExit",
                "Error: odd raised Odd: odd",
                "Error: stop_iteration raised StopIteration: done",
                "Error: cancelled raised CancelledError.",
                "Error: unprintable raised Unprintable: (its message cannot be shown)",
            ]
            assert rollout.metrics["tool_errors"] == 8 and rollout.metrics["exit_sync_errors"] == 1


async def test_the_rollouts_own_cancellation_still_goes_through_a_tool() -> None:
    started = asyncio.Event()

    async def swallow_nothing() -> str:
        """Waits until cancelled."""
        started.set()
        await asyncio.sleep(30)
        return "never"

    env = pa.ToolEnv(tools=[swallow_nothing], dataset=[{"question": "q"}], tool_timeout=60)
    run = asyncio.create_task(env.run(first_turn("swallow_nothing")))
    await asyncio.wait_for(started.wait(), 5)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    timed = pa.ToolEnv(tools=[swallow_nothing], dataset=[{"question": "q"}], tool_timeout=60, timeout=0.2)
    [rollout] = await timed.run(first_turn("swallow_nothing"))  # the rollout's timeout cancels it
    assert rollout.stop_reason == "timeout" and rollout.error is not None


# --- what a tool returns ---------------------------------------------------------------------


def huge(chars: int) -> str:
    """A long text."""
    return "y" * chars


def huge_json(items: int) -> list[int]:
    """A long list."""
    return list(range(items))


def loud(chars: int) -> str:
    """Raise with a long message."""
    raise ValueError("z" * chars)


def cut_marker(shown: int, total: int) -> str:
    return f"\n[... {total - shown:,} more characters cut: the result had {total:,}, the first {shown:,} are shown]"


async def test_results_are_cut_to_the_default_cap_with_a_marker(tmp_path: Path) -> None:
    size = 5_000_000
    env = pa.ToolEnv(tools=[huge, huge_json, loud], dataset=[{"question": "q"}])

    def model(messages: pa.Messages) -> Any:
        if len(messages) > 1:
            return "done"
        turn = [("huge", {"chars": size}), ("huge_json", {"items": 1_000_000}), ("loud", {"chars": size})]
        made = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(turn)
        ]
        return {"content": None, "tool_calls": made}

    client = pa.ScriptedClient(model)
    run = await pa.evaluate(
        env, client, pa.RunSpec(num_examples=1, rollouts_per_example=1), output_dir=tmp_path
    )
    cap = DEFAULT_MAX_RESULT_CHARS
    big, listing, error = tool_texts(run.rollouts[0])
    assert big == "y" * cap + cut_marker(cap, size)
    total = len(json.dumps(list(range(1_000_000))))
    assert listing.startswith("[0, 1, 2") and listing.endswith(cut_marker(cap, total))
    assert error.startswith("Error: loud raised ValueError: zzz") and len(error) < cap + 200
    assert run.path is not None
    assert (run.path / "results.jsonl").stat().st_size < 5 * cap  # the file holds what the model saw


async def test_the_cap_is_set_per_environment_and_per_tool() -> None:
    capped = pa.Tool.from_function(huge, name="capped", max_result_chars=10)
    env = pa.ToolEnv(tools=[huge, capped], dataset=[{"question": "q"}], max_result_chars=100)
    env.add_tool(huge, name="roomy", max_result_chars=1_000)
    [rollout] = await env.run(first_turn("huge", "capped", "roomy", arguments='{"chars": 5000}'))
    texts = tool_texts(rollout)
    assert texts == [
        "y" * 100 + cut_marker(100, 5000),
        "y" * 10 + cut_marker(10, 5000),
        "y" * 1000 + cut_marker(1000, 5000),
    ]
    [rollout] = await env.run(first_turn("x" * 100_000))  # a model's name for a tool that is not there
    assert tool_texts(rollout)[0].startswith("Error: unknown tool 'xxx") and len(tool_texts(rollout)[0]) < 300
    uncapped = pa.ToolEnv(tools=[huge], dataset=[{"question": "q"}], max_result_chars=None)
    [rollout] = await uncapped.run(first_turn("huge", arguments='{"chars": 50000}'))
    assert tool_texts(rollout) == ["y" * 50_000]
    for bad in (0, -1, 1.5, True, "100"):
        with pytest.raises(ValueError, match="max_result_chars must be a positive integer or None"):
            pa.ToolEnv(tools=[huge], dataset=[{"question": "q"}], max_result_chars=bad)  # type: ignore[arg-type]  # the point
        with pytest.raises(pa.ToolDefinitionError, match="max_result_chars must be a positive integer"):
            pa.Tool.from_function(huge, max_result_chars=bad)  # type: ignore[arg-type]  # the point
