"""Each bundled environment end to end through OpenAIClient over real HTTP, and the same rollouts
through ScriptedClient: the client is swappable and the rewards do not change."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import double_check
import pytest
import reverse_text

import palaestra as pa
from palaestra.testing import FakeOpenAIServer

Policy = Callable[..., str]


def http_reply(policy: Policy) -> Callable[[dict[str, Any]], str]:
    """Serve a scripted policy over HTTP, with the rng the ScriptedClient would give it."""

    def reply(body: dict[str, Any]) -> str:
        return policy(messages=body["messages"], rng=random.Random(body["seed"]))

    return reply


def policy_args(policy: Policy) -> Policy:
    def call(messages: pa.Messages, rng: random.Random) -> str:
        return policy(messages=messages, rng=rng)

    return call


def with_rng(policy: Callable[[pa.Messages], str]) -> Policy:
    return lambda messages, rng: policy(messages)


CASES = [
    ("reverse_text", reverse_text.noisy_reverser),
    ("reverse_text", with_rng(reverse_text.oracle)),
    ("double_check", double_check.doubter),
    ("double_check", with_rng(double_check.stubborn)),
]


@pytest.mark.parametrize("transport", ["aiohttp", "openai"])
@pytest.mark.parametrize(("env_name", "policy"), CASES)
async def test_http_and_scripted_clients_agree(env_name: str, policy: Policy, transport: str) -> None:
    env = pa.load_environment(env_name, num_examples=6)
    async with FakeOpenAIServer(http_reply(policy)) as server:
        async with pa.OpenAIClient(server.model, base_url=server.base_url, transport=transport) as client:
            over_http = await env.run(client, pa.RunSpec(rollouts_per_example=3, max_concurrent=8, seed=3))
    in_process = await env.run(
        pa.ScriptedClient(policy_args(policy)), pa.RunSpec(rollouts_per_example=3, seed=3)
    )

    assert len(over_http) == 18 and all(r.error is None for r in over_http)
    assert [r.reward for r in over_http] == [r.reward for r in in_process]
    assert [r.metrics for r in over_http] == [r.metrics for r in in_process]
    assert [r.completion for r in over_http] == [r.completion for r in in_process]
    assert server.request_count == sum(len(r.turns) for r in over_http)  # one request per model turn


async def test_double_check_is_multi_turn_over_http() -> None:
    env = pa.load_environment("double_check", num_examples=4)
    async with FakeOpenAIServer(http_reply(with_rng(double_check.stubborn))) as server:
        async with pa.OpenAIClient(server.model, base_url=server.base_url) as client:
            rollouts = await env.run(client, pa.RunSpec(rollouts_per_example=2))
    for r in rollouts:
        assert [m["role"] for m in r.completion] == ["assistant", "user", "assistant"]
        assert r.completion[1]["content"] == "Are you sure?"
        assert len(r.turns) == 2 and r.reward == 1.0
    # the second request of each rollout saw the first answer and the question
    second_turns = [b for b in server.requests if len(b["messages"]) > len(env.examples[0].prompt)]
    assert len(second_turns) == 8
    assert all(b["messages"][-1]["content"] == "Are you sure?" for b in second_turns)


async def test_noisy_policy_gives_a_spread_of_rewards_over_http() -> None:
    env = pa.load_environment("reverse_text", num_examples=20)
    async with FakeOpenAIServer(http_reply(reverse_text.noisy_reverser)) as server:
        async with pa.OpenAIClient(server.model, base_url=server.base_url) as client:
            rollouts = await env.run(client, pa.RunSpec(rollouts_per_example=3))
    rewards = {round(r.reward, 6) for r in rollouts}
    assert len(rewards) > 5 and max(rewards) == 1.0 and min(rewards) < 0.9
