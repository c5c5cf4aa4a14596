"""The Tinker cookbook-style adapter, driven by a small local loop as a cookbook recipe drives envs.

A toy renderer stands in for a tokenizer (a prompt is the UTF-8 bytes of the JSON messages, an
action the bytes of the reply); trajectories' rewards must equal palaestra's own run of the same
replies (the loop samples with the per-turn seed the adapter exposes), group reward functions
included, and the action tokens must be the rollout's.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
import tictactoe

import palaestra as pa
from palaestra.interop.tinker import ERROR_METRIC, PalaestraDataset, PalaestraEnv, PalaestraGroupBuilder


class BytesRenderer:
    """Messages → the bytes of their JSON; reply tokens → the text they spell."""

    def build_generation_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        return list(json.dumps(messages, sort_keys=True).encode())

    def get_stop_sequences(self) -> list[str]:
        return ["<|end|>"]

    def parse_response(self, response: list[int]) -> tuple[dict[str, Any], bool]:
        return {"role": "assistant", "content": bytes(response).decode()}, True


def policy(messages: pa.Messages, rng: random.Random) -> str:
    """Optimal or random moves, now and then an illegal one."""
    if rng.random() < 0.15:
        return "<move>9</move>"
    return (tictactoe.optimal_player if rng.random() < 0.5 else tictactoe.random_player)(messages, rng)


@pa.group_reward
def above_group_mean(state: list[dict[str, Any]]) -> list[float]:
    won = [float(s["outcome"] == "win") for s in state]
    return [w - sum(won) / len(won) for w in won]


async def play(env: PalaestraEnv) -> tuple[list[tuple[list[int], list[int], float]], Any]:
    """One episode as the cookbook's rollout loop plays it: (observation, action, reward) per step."""
    observation, stop = await env.initial_observation()
    assert stop == ["<|end|>"]
    transitions = []
    while True:
        messages = json.loads(bytes(observation).decode())
        assert env.sampling is not None  # the per-turn seed palaestra's engine would send the model
        action = list(policy(messages, random.Random(env.sampling.seed)).encode())
        result = await env.step(action)
        transitions.append((observation, action, result.reward))
        if result.episode_done:
            return transitions, result.next_observation
        observation = result.next_observation


async def test_group_rewards_equal_palaestras_run() -> None:
    env = pa.load_environment("tictactoe", num_examples=4)
    env.rubric.add(above_group_mean, weight=1.0)
    local = await env.run(pa.ScriptedClient(policy), pa.RunSpec(seed=3, rollouts_per_example=3))
    dataset = PalaestraDataset(env, BytesRenderer(), batch_size=3, group_size=3, seed=3)
    assert len(dataset) == 2
    got: list[tuple[float, dict[str, float]]] = []
    for index in range(len(dataset)):
        for builder in dataset.get_batch(index):
            envs = await builder.make_envs()
            trajectories = await asyncio.gather(*(play(e) for e in envs))
            assert all(r == 0.0 for t, _ in trajectories for *_, r in t)  # the group builder rewards
            got += await builder.compute_group_rewards(trajectories)
            for e, (transitions, final) in zip(envs, trajectories, strict=True):
                assert e.rollout is not None
                assert [t.token_ids for t in e.rollout.turns] == [a for _, a, _ in transitions]
                assert json.loads(bytes(final).decode()) == e.rollout.messages
    assert [reward for reward, _ in got] == pytest.approx([r.reward for r in local])
    for (_, metrics), rollout in zip(got, local, strict=True):
        assert metrics == pytest.approx({**rollout.metrics, ERROR_METRIC: 0.0})
    assert len({r.reward for r in local}) >= 3 and any(r.metrics["above_group_mean"] for r in local)


async def test_an_env_alone_rewards_its_last_step() -> None:
    env = pa.load_environment("tictactoe", num_examples=2)
    [local] = await env.run(pa.ScriptedClient(policy), pa.RunSpec(seed=8, num_examples=1))
    alone = PalaestraEnv(env, env.examples[0], BytesRenderer(), seed=8)
    transitions, _ = await play(alone)
    assert [r for *_, r in transitions[:-1]] == [0.0] * (len(transitions) - 1)
    assert transitions[-1][2] == pytest.approx(local.reward)


async def test_an_abandoned_env_cleans_up_and_a_failed_rollout_is_flagged() -> None:
    env = pa.load_environment("tictactoe", num_examples=1)
    cleaned: list[int] = []
    cleanup = env.cleanup_state  # type: ignore[attr-defined]

    async def counted(state: pa.State) -> None:
        cleaned.append(1)
        await cleanup(state)

    env.cleanup_state = counted  # type: ignore[attr-defined]
    left = PalaestraEnv(env, env.examples[0], BytesRenderer())
    await left.initial_observation()
    await left.aclose()
    assert cleaned == [1] and left.rollout is None

    builder = PalaestraGroupBuilder(env, env.examples[0], BytesRenderer(), group_size=2)
    envs = await builder.make_envs()
    await play(envs[0])
    await envs[1].initial_observation()
    await envs[1].aclose()  # never finished: no rollout to score
    rewards = await builder.compute_group_rewards([None, None])
    assert rewards[1] == (0.0, {ERROR_METRIC: 1.0}) and rewards[0][1][ERROR_METRIC] == 0.0
    with pytest.raises(ValueError, match="3 trajectories for a group of 2"):
        await builder.compute_group_rewards([None] * 3)
    with pytest.raises(IndexError):
        PalaestraDataset(env, BytesRenderer(), batch_size=1, group_size=1).get_batch(1)
