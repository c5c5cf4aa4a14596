"""Reverse Text end to end with scripted policies: dataset, rewards, determinism, arguments."""

from __future__ import annotations

import statistics

import pytest
import reverse_text as rt

import palaestra as pa


def test_dataset_is_generated_from_the_seed() -> None:
    rows = rt.make_dataset(50, seed=0)
    assert len(rows) == 50
    assert all(row["answer"] == row["question"][::-1] for row in rows)
    assert len({row["question"] for row in rows}) == 50  # varied paragraphs, not one repeated
    assert rows == rt.make_dataset(50, seed=0)
    assert rows[:10] == rt.make_dataset(10, seed=0)  # a smaller dataset is a prefix
    assert rows != rt.make_dataset(50, seed=1)


def test_load_environment_builds_prompts_from_the_dataset() -> None:
    env = rt.load_environment(num_examples=5, seed=3)
    assert isinstance(env, pa.SingleTurnEnv)
    assert len(env.examples) == 5
    first = env.examples[0]
    assert first.prompt[0] == {"role": "system", "content": rt.SYSTEM_PROMPT}
    assert first.prompt[1]["role"] == "user"
    assert first.answer == first.prompt[1]["content"][::-1]
    custom = rt.load_environment(num_examples=1, system_prompt="Backwards, please.")
    assert custom.examples[0].prompt[0]["content"] == "Backwards, please."


async def test_oracle_scores_one_everywhere() -> None:
    env = rt.load_environment(num_examples=10)
    rollouts = await env.run(pa.ScriptedClient(rt.oracle), pa.RunSpec(rollouts_per_example=2))
    assert len(rollouts) == 20
    assert all(r.error is None and r.stop_reason == "answered" for r in rollouts)
    assert [r.reward for r in rollouts] == [1.0] * 20
    assert all(r.metrics == {"lcs_reward": 1.0, "format_reward": 1.0} for r in rollouts)


async def test_noisy_reverser_gives_a_spread_of_rewards() -> None:
    env = rt.load_environment(num_examples=20)
    rollouts = await env.run(pa.ScriptedClient(rt.noisy_reverser), pa.RunSpec(rollouts_per_example=3, seed=0))
    rewards = [r.reward for r in rollouts]
    assert all(r.error is None for r in rollouts)
    assert 0.5 < statistics.mean(rewards) < 0.95
    assert max(rewards) == 1.0 and min(rewards) == 0.0  # perfect replies and forgotten tags
    assert any(0.0 < x < 1.0 for x in rewards)  # and partial credit in between
    assert statistics.mean(r.metrics["format_reward"] for r in rollouts) < 1.0


async def test_same_seed_same_rollouts_and_rewards() -> None:
    async def run(seed: int) -> list[tuple[str, float | None]]:
        env = rt.load_environment(num_examples=8, seed=5)
        rollouts = await env.run(
            pa.ScriptedClient(rt.noisy_reverser), pa.RunSpec(rollouts_per_example=3, seed=seed)
        )
        return [(r.completion[-1]["content"], r.reward) for r in rollouts]

    first = await run(seed=0)
    assert first == await run(seed=0)
    assert first != await run(seed=1)


def reply(text: str) -> pa.Messages:
    return [{"role": "assistant", "content": text}]


def test_lcs_reward_compares_the_tagged_text_with_the_reversal() -> None:
    parser = pa.XMLParser(["reversed_text"])
    answer = "olleH"
    assert rt.lcs_reward(parser, reply("<reversed_text>olleH</reversed_text>"), answer) == 1.0
    assert rt.lcs_reward(parser, reply("<reversed_text> olleH </reversed_text>"), answer) == 1.0
    assert rt.lcs_reward(parser, reply("<reversed_text>olle</reversed_text>"), answer) == pytest.approx(8 / 9)
    assert rt.lcs_reward(parser, reply("<reversed_text>Hello</reversed_text>"), answer) < 0.5
    assert rt.lcs_reward(parser, reply("olleH"), answer) == 0.0  # no tags, no answer
    assert rt.lcs_reward(parser, [], answer) == 0.0


async def test_format_is_a_metric_not_part_of_the_reward() -> None:
    def duplicated_tags(messages: pa.Messages) -> str:
        return "<reversed_text>draft</reversed_text>\n" + rt.oracle(messages)

    env = rt.load_environment(num_examples=2)
    rollouts = await env.run(pa.ScriptedClient(duplicated_tags))
    assert [r.reward for r in rollouts] == [1.0, 1.0]  # the last block is the answer
    assert [r.metrics["format_reward"] for r in rollouts] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_examples": 0}, "num_examples must be an integer ≥ 1, got 0"),
        ({"num_examples": -5}, "num_examples"),
        ({"num_examples": "5"}, "num_examples"),
        ({"num_examples": True}, "num_examples"),
        ({"seed": "zero"}, "seed must be an integer"),
        ({"system_prompt": "  "}, "system_prompt must be a non-empty string"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rt.load_environment(**kwargs)


def test_lengths_set_the_paragraph_shape() -> None:
    rows = rt.load_environment(num_examples=40, seed=0, sentences=[1, 1], words=[4, 8]).examples
    for row in rows:
        text = row.prompt[1]["content"]
        assert text[-1] in ".!?" and not any(p in text[:-1] for p in ".!?")  # one sentence
        assert 4 <= len(text.split()) <= 8
    # the defaults are the original paragraphs: two to four sentences of five to twelve words
    assert rt.make_dataset(20, seed=0) == rt.make_dataset(20, seed=0, sentences=(2, 4), words=(5, 12))


@pytest.mark.parametrize("bad", [[0, 2], [3, 2], [1], "2", [1.0, 2], [True, 2]])
def test_bad_lengths_are_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match="words must be"):
        rt.load_environment(num_examples=1, words=bad)  # type: ignore[arg-type]
