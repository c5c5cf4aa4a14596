"""``pa.RemoteEnvironment``: an environment behind ``palaestra env serve`` runs as a local one.

The server runs in a thread of its own (as it would on another machine); the same environment,
seeds and scripted model, run locally and remotely, give the same rollouts and rewards, group
reward functions included, and ``palaestra eval URL`` saves the same results.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sql_quiz
import tictactoe

import palaestra as pa
from palaestra.cli import main
from palaestra.interop.server import serving


@pytest.fixture
def served() -> Iterator[Any]:
    """``start(env)`` serves ``env`` from another thread's event loop and returns its URL."""
    stops: list[tuple[asyncio.AbstractEventLoop, asyncio.Event, threading.Thread]] = []

    def start(env: pa.Environment, **options: Any) -> str:
        ready: list[str] = []
        started = threading.Event()
        loop = asyncio.new_event_loop()
        stop = asyncio.Event()

        async def run() -> None:
            async with serving(env, **options) as url:
                ready.append(url)
                started.set()
                await stop.wait()

        thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
        thread.start()
        assert started.wait(10)
        stops.append((loop, stop, thread))
        return ready[0]

    yield start
    for loop, stop, thread in stops:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def ttt_policy(messages: pa.Messages, rng: random.Random) -> str:
    if rng.random() < 0.15:
        return "<move>9</move>"
    return (tictactoe.optimal_player if rng.random() < 0.5 else tictactoe.random_player)(messages, rng)


@pa.group_reward
def above_group_mean(state: list[dict[str, Any]]) -> list[float]:
    won = [float(s["outcome"] == "win") for s in state]
    return [w - sum(won) / len(won) for w in won]


def assert_same(remote: list[pa.Rollout], local: list[pa.Rollout]) -> None:
    assert len(remote) == len(local) > 0
    for a, b in zip(remote, local, strict=True):
        assert (a.example_id, a.rollout_index, a.seed) == (b.example_id, b.rollout_index, b.seed)
        assert a.error is None and b.error is None, (a.error, b.error)
        assert a.reward == pytest.approx(b.reward)
        timed = {k for k in b.metrics if k.endswith("_seconds")}  # a tool's seconds differ run to run
        assert {k: v for k, v in a.metrics.items() if k not in timed} == pytest.approx(
            {k: v for k, v in b.metrics.items() if k not in timed}
        )
        assert (a.prompt, a.completion, a.stop_reason, a.tools) == (
            b.prompt,
            b.completion,
            b.stop_reason,
            b.tools,
        )
        assert len(a.turns) == len(b.turns) and a.usage == b.usage
        assert untimed(a.to_dict()["state"]) == untimed(b.to_dict()["state"])


def untimed(value: Any) -> Any:
    """``value`` without the keys that measure seconds, at any depth."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not str(k).endswith("_seconds")}
    return [untimed(v) for v in value] if isinstance(value, list) else value


async def test_remote_tictactoe_equals_local_group_rewards_too(served: Any) -> None:
    env = pa.load_environment("tictactoe", num_examples=6)
    env.rubric.add(above_group_mean, weight=1.0)
    spec = pa.RunSpec(seed=4, rollouts_per_example=3, max_concurrent=4)
    local = await env.run(pa.ScriptedClient(ttt_policy), spec)
    url = served(env)
    remote_env = await asyncio.to_thread(pa.RemoteEnvironment, url)
    async with remote_env:
        remote = await remote_env.run(pa.ScriptedClient(ttt_policy), spec)
        assert remote_env.metric_info() == env.metric_info()
        assert [e.prompt for e in remote_env.examples] == [e.prompt for e in env.examples]
    assert_same(remote, local)
    assert len({r.reward for r in local}) > 3 and any(r.metrics["above_group_mean"] for r in local)


async def test_remote_sql_quiz_with_tool_calls_equals_local(served: Any) -> None:
    env = pa.load_environment("sql_quiz", num_examples=4)

    def policy(messages: pa.Messages, rng: random.Random) -> Any:
        return sql_quiz.teacher(messages) if rng.random() < 0.6 else sql_quiz.sloppy(messages, rng)

    local = await env.run(pa.ScriptedClient(policy), pa.RunSpec(seed=2, rollouts_per_example=2))
    remote_env = await asyncio.to_thread(pa.RemoteEnvironment, served(env))
    async with remote_env:
        remote = await remote_env.run(pa.ScriptedClient(policy), pa.RunSpec(seed=2, rollouts_per_example=2))
    assert_same(remote, local)
    assert any(m.get("tool_calls") for r in remote for m in r.completion)


async def test_token_ids_and_logprobs_cross_the_boundary(served: Any) -> None:
    env = pa.load_environment("tictactoe", num_examples=1)

    def policy(messages: pa.Messages, rng: random.Random) -> pa.ModelResponse:
        text = tictactoe.optimal_player(messages, rng)
        return pa.ModelResponse(
            {"role": "assistant", "content": text},
            finish_reason="stop",
            token_ids=[len(messages), 7],
            logprobs=[-0.5, -0.25],
            prompt_token_ids=[1, 2, 3],
        )

    remote_env = await asyncio.to_thread(pa.RemoteEnvironment, served(env))
    async with remote_env:
        [rollout] = await remote_env.run(pa.ScriptedClient(policy), pa.RunSpec(seed=1))
    assert rollout.error is None and len(rollout.turns) >= 2
    for turn in rollout.turns:
        assert turn.token_ids == [turn.prompt_messages, 7] and turn.logprobs == [-0.5, -0.25]
        assert turn.prompt_token_ids == [1, 2, 3]


def test_palaestra_eval_runs_a_served_environment(served: Any, tmp_path: Path) -> None:
    env = pa.load_environment("tictactoe", num_examples=4)
    url = served(env)
    argv = ["-m", "scripted:tictactoe:optimal_player", "-n", "4", "-r", "2", "--seed", "3", "--quiet"]
    assert main(["eval", url, *argv, "-o", str(tmp_path / "remote")]) == 0
    assert main(["eval", "tictactoe", "-a", '{"num_examples": 4}', *argv, "-o", str(tmp_path / "local")]) == 0

    def rewards(root: Path) -> list[tuple[int, int, float]]:
        [results] = root.glob("evals/*/*/results.jsonl")
        rows = [json.loads(line) for line in results.read_text().splitlines()]
        return sorted((r["example_id"], r["rollout_index"], r["reward"]) for r in rows)

    assert rewards(tmp_path / "remote") == rewards(tmp_path / "local")
    assert len(rewards(tmp_path / "local")) == 8


def test_an_unreachable_server_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(pa.RemoteEnvironmentError, match="cannot reach"):
        pa.RemoteEnvironment("http://127.0.0.1:9")
    assert main(["eval", "http://127.0.0.1:9", "-m", "scripted:tictactoe:optimal_player", "-n", "1"]) == 2
    assert "cannot reach the environment server" in capsys.readouterr().err
    with pytest.raises(pa.EnvironmentArgsError, match="bogus"):
        pa.load_environment("http://127.0.0.1:9", bogus=1)


async def test_a_server_that_goes_away_is_recorded_not_raised(served: Any) -> None:
    env = pa.load_environment("tictactoe", num_examples=2)
    remote_env = await asyncio.to_thread(pa.RemoteEnvironment, served(env))
    remote_env.url = "http://127.0.0.1:9"  # as if the server had stopped after the handshake
    async with remote_env:
        rollouts = await remote_env.run(pa.ScriptedClient(ttt_policy), pa.RunSpec(seed=1))
    assert [r.error.stage if r.error else None for r in rollouts] == ["env", "env"]
    assert all("RemoteEnvironmentError" == r.error.type for r in rollouts if r.error)
