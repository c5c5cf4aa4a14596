"""DoubleCheck end to end with scripted policies: turns, stop reason, last-answer scoring, arguments."""

from __future__ import annotations

import operator
import statistics

import double_check as dc
import pytest

import palaestra as pa

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def test_dataset_is_generated_from_the_seed() -> None:
    rows = dc.make_dataset(60, seed=0)
    assert len(rows) == 60
    for row in rows:
        a, op, b = str(row["question"]).removeprefix("What is ").removesuffix("?").split()
        assert row["answer"] == OPERATIONS[op](int(a), int(b))
    assert {str(row["question"]).split()[3] for row in rows} == {"+", "-", "*"}
    assert rows == dc.make_dataset(60, seed=0)
    assert rows[:7] == dc.make_dataset(7, seed=0)
    assert rows != dc.make_dataset(60, seed=1)


async def test_two_model_turns_then_stop() -> None:
    env = dc.load_environment(num_examples=4)
    assert isinstance(env, pa.MultiTurnEnv)
    rollouts = await env.run(pa.ScriptedClient(dc.stubborn), pa.RunSpec(rollouts_per_example=2))
    for r in rollouts:
        assert r.error is None
        assert r.stop_reason == "answered_twice"
        assert len(r.turns) == 2
        assert [m["role"] for m in r.completion] == ["assistant", "user", "assistant"]
        assert r.completion[1]["content"] == "Are you sure?"
        assert r.prompt[-1]["content"].startswith("What is ")


async def test_stubborn_is_always_right_and_never_changes() -> None:
    env = dc.load_environment(num_examples=10)
    rollouts = await env.run(pa.ScriptedClient(dc.stubborn), pa.RunSpec(rollouts_per_example=2))
    assert all(
        r.reward == 1.0 and r.metrics == {"correct_answer": 1.0, "format_reward": 1.0, "changed_answer": 0.0}
        for r in rollouts
    )


async def test_doubter_loses_the_reward_when_it_changes_its_answer() -> None:
    env = dc.load_environment(num_examples=20)
    rollouts = await env.run(pa.ScriptedClient(dc.doubter), pa.RunSpec(rollouts_per_example=3, seed=0))
    assert all(r.error is None for r in rollouts)
    assert 0.3 < statistics.mean(r.reward for r in rollouts) < 0.9
    for r in rollouts:
        assert r.metrics["changed_answer"] == 1.0 - r.reward  # right first, so changing means wrong


async def run_policy(*replies: str) -> pa.Rollout:
    """One rollout where the model says ``replies[i]`` on turn ``i``."""

    def policy(messages: pa.Messages) -> str:
        return replies[sum(m["role"] == "assistant" for m in messages)]

    env = dc.load_environment(num_examples=1)
    (rollout,) = await env.run(pa.ScriptedClient(policy))
    assert rollout.error is None
    return rollout


async def test_the_last_answer_is_the_one_scored() -> None:
    right = dc.make_dataset(1, seed=0)[0]["answer"]
    wrong = int(right) + 1
    fixed = await run_policy(f"<answer>{wrong}</answer>", f"<answer>{right}</answer>")
    assert fixed.reward == 1.0 and fixed.metrics["changed_answer"] == 1.0
    caved = await run_policy(f"<answer>{right}</answer>", f"<answer>{wrong}</answer>")
    assert caved.reward == 0.0 and caved.metrics["changed_answer"] == 1.0


async def test_answers_are_compared_as_numbers() -> None:
    right = int(dc.make_dataset(1, seed=0)[0]["answer"])
    same = await run_policy(f"<answer>{right}</answer>", f"<answer> {right:,}.0 </answer>")
    assert same.reward == 1.0 and same.metrics["changed_answer"] == 0.0
    untagged = await run_policy(f"<answer>{right}</answer>", f"I'm sure: {right}")
    assert untagged.reward == 0.0 and untagged.metrics["format_reward"] == 0.5


@pytest.mark.parametrize("text", [None, "", "abc", "nan", "inf", "12 apples"])
def test_as_number_rejects_non_numbers(text: str | None) -> None:
    assert dc.as_number(text) is None


async def test_same_seed_same_rollouts_and_rewards() -> None:
    async def run(seed: int) -> list[tuple[str, float | None]]:
        env = dc.load_environment(num_examples=10, seed=2)
        rollouts = await env.run(pa.ScriptedClient(dc.doubter), pa.RunSpec(rollouts_per_example=3, seed=seed))
        return [(r.completion[-1]["content"], r.reward) for r in rollouts]

    first = await run(seed=0)
    assert first == await run(seed=0)
    assert first != await run(seed=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_examples": 0}, "num_examples must be an integer ≥ 1, got 0"),
        ({"num_examples": 2.5}, "num_examples"),
        ({"seed": None}, "seed must be an integer"),
        ({"system_prompt": ""}, "system_prompt must be a non-empty string"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dc.load_environment(**kwargs)
