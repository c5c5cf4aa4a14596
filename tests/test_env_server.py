"""The environment server (``palaestra env serve``) driven from a plain HTTP client.

Each environment is played over HTTP with a scripted policy, the per-turn seed taken from the
observation, and must give the rewards, metrics and messages of palaestra's own run of the same
environment, seeds and policy. Bad requests get one 4xx each and leave their episode playable.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sql_quiz
import tictactoe

import palaestra as pa
from palaestra.cli import main
from palaestra.interop.server import serving

Policy = Callable[[pa.Messages, random.Random], Any]
ENVS = Path(__file__).parent / "verifiers_envs"


def action(reply: Any) -> dict[str, Any]:
    return {"content": reply} if isinstance(reply, str) else {"message": {"role": "assistant", **reply}}


async def post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json()


async def play(
    session: aiohttp.ClientSession, url: str, policy: Policy, **reset: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One episode over HTTP, as a trainer in another language would play it: (first, last) bodies."""
    status, first = await post(session, f"{url}/reset", reset)
    assert status == 200, first
    body, episode = first, first["metadata"]["episode_id"]
    while not body["done"]:
        obs = body["observation"]
        reply = policy(obs["messages"], random.Random(obs["sampling"]["seed"]))
        status, body = await post(session, f"{url}/step", {"episode_id": episode, "action": action(reply)})
        assert status == 200, body
    return first, body


def untimed(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics that do not measure time (a tool's seconds differ run to run)."""
    return {k: v for k, v in metrics.items() if not k.endswith("_seconds")}


def same(local: pa.Rollout, first: dict[str, Any], last: dict[str, Any]) -> None:
    assert local.error is None and last["metadata"]["error"] is None
    assert last["reward"] == pytest.approx(local.reward)
    assert untimed(last["metadata"]["metrics"]) == pytest.approx(untimed(local.metrics))
    assert last["metadata"]["stop_reason"] == local.stop_reason
    assert last["metadata"]["rollout_seed"] == local.seed
    assert first["observation"]["messages"] == local.prompt
    assert last["observation"]["messages"] == local.prompt + local.completion


def ttt_policy(messages: pa.Messages, rng: random.Random) -> str:
    """Optimal or random moves, now and then an illegal one: rewards that vary with the seed."""
    if rng.random() < 0.15:
        return "<move>9</move>"
    return (tictactoe.optimal_player if rng.random() < 0.5 else tictactoe.random_player)(messages, rng)


@pytest.mark.parametrize(
    ("name", "args", "policy", "outcomes"),
    [
        ("tictactoe", {"num_examples": 8}, ttt_policy, 3),
        ("sql_quiz", {"num_examples": 6}, lambda messages, rng: sql_quiz.teacher(messages), 1),  # tool calls
        ("sql_quiz", {"num_examples": 6}, sql_quiz.sloppy, 2),
    ],
)
async def test_http_episodes_equal_palaestra_runs(
    name: str, args: dict[str, Any], policy: Policy, outcomes: int
) -> None:
    env = pa.load_environment(name, **args)
    local = await env.run(pa.ScriptedClient(policy), pa.RunSpec(seed=5))
    async with serving(env) as url, aiohttp.ClientSession() as session:
        for rollout in local:
            first, last = await play(session, url, policy, seed=5, example_id=rollout.example_id)
            same(rollout, first, last)
            assert first["observation"]["tools"] == env.tool_schemas()
    assert len({r.reward for r in local}) >= outcomes  # the comparison sees different outcomes


async def test_a_verifiers_package_over_http(monkeypatch: pytest.MonkeyPatch) -> None:
    from palaestra.compat.verifiers.loading import install

    monkeypatch.syspath_prepend(str(ENVS))
    assert install()
    before = set(sys.modules)
    try:
        import vf_tictactoe

        env = vf_tictactoe.load_environment(num_examples=6, seed=1)

        def policy(messages: pa.Messages, rng: random.Random) -> str:
            return f"<reasoning>hm</reasoning>\n<move>{rng.randint(1, 9)}</move>"

        local = await env.run(pa.ScriptedClient(policy), pa.RunSpec(seed=2, rollouts_per_example=2))
        async with serving(env) as url, aiohttp.ClientSession() as session:
            for rollout in local:
                first, last = await play(
                    session,
                    url,
                    policy,
                    seed=2,
                    example_id=rollout.example_id,
                    rollout_index=rollout.rollout_index,
                )
                same(rollout, first, last)
        assert len({r.reward for r in local}) > 1
    finally:
        for module in set(sys.modules) - before:
            if module.startswith(("verifiers", "vf_")):
                del sys.modules[module]


async def test_the_example_defaults_to_the_seeds_and_examples_are_listed() -> None:
    env = pa.load_environment("tictactoe", num_examples=5)
    async with serving(env, name="tictactoe") as url, aiohttp.ClientSession() as session:
        _, first = await post(session, f"{url}/reset", {"seed": 7})
        assert first["metadata"]["example_id"] == 7 % 5
        _, empty = await post(session, f"{url}/reset", None)  # OpenEnv's reset takes no body
        assert empty["metadata"]["example_id"] == 0 and empty["metadata"]["seed"] == 0
        async with session.get(f"{url}/examples", params={"offset": 3, "limit": 10}) as response:
            listed = await response.json()
        assert listed["total"] == 5 and [e["id"] for e in listed["examples"]] == [3, 4]
        assert listed["examples"][0]["prompt"] == env.examples[3].prompt
        async with session.get(f"{url}/metadata") as response:
            meta = await response.json()
        assert meta["name"] == "tictactoe" and meta["num_examples"] == 5
        assert meta["metrics"] == env.metric_info()


async def test_group_scoring_equals_the_engines() -> None:
    """``score: false`` then ``POST /score``: the episodes of one example scored as one group."""
    env = pa.load_environment("tictactoe", num_examples=2)

    @pa.group_reward
    def above_group_mean(state: list[dict[str, Any]]) -> list[float]:
        won = [float(s["outcome"] == "win") for s in state]
        return [w - sum(won) / len(won) for w in won]

    env.rubric.add(above_group_mean, weight=1.0)
    local = await env.run(pa.ScriptedClient(ttt_policy), pa.RunSpec(seed=1, rollouts_per_example=4))
    async with serving(env) as url, aiohttp.ClientSession() as session:
        for example_id in (0, 1):
            ids = []
            for index in range(4):
                first, last = await play(
                    session, url, ttt_policy, seed=1, example_id=example_id, rollout_index=index, score=False
                )
                assert last["done"] and last["reward"] is None and last["metadata"]["scored"] is False
                ids.append(first["metadata"]["episode_id"])
            status, scored = await post(session, f"{url}/score", {"episode_ids": ids})
            assert status == 200, scored
            mine = [r for r in local if r.example_id == example_id]
            assert [r["reward"] for r in scored["results"]] == pytest.approx([r.reward for r in mine])
            for result, rollout in zip(scored["results"], mine, strict=True):
                assert result["metrics"] == pytest.approx(rollout.metrics)
            status, again = await post(session, f"{url}/score", {"episode_ids": ids})
            assert (status, again["code"]) == (409, "already_scored")
    assert any(r.metrics["above_group_mean"] != 0 for r in local)


def test_the_command_refuses_bad_arguments_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "serve", "no_such_env"]) == 2
    assert "unknown environment 'no_such_env'" in capsys.readouterr().err
    assert main(["env", "serve", "tictactoe", "-a", "[1]"]) == 2
    assert "-a must be a JSON object" in capsys.readouterr().err
    assert main(["env", "serve", "tictactoe", "--max-episodes", "0"]) == 2
    with pytest.raises(SystemExit) as exit_:
        main(["env", "serve", "tictactoe", "--idle-timeout", "0"])
    assert exit_.value.code == 2
