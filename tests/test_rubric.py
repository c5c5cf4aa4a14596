"""Tests for palaestra.rubric: weights, argument binding, group rewards and recorded scoring errors."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

import palaestra as pa
from palaestra import (
    BindingError,
    Parser,
    RewardError,
    Rollout,
    Rubric,
    RubricGroup,
    ScriptedClient,
    SingleTurnEnv,
    XMLParser,
    group_reward,
)
from palaestra.rubric import STANDARD_ARGS

ROWS = [
    {"question": "2+2?", "answer": "4", "info": {"level": 1}, "difficulty": "easy"},
    {"question": "3*3?", "answer": "9", "info": {"level": 2}, "difficulty": "hard"},
]


def reply_with_seed(sampling: Any) -> str:
    """A policy whose reply differs per rollout (the request seed does)."""
    return f"seed {sampling.seed}"


def make_env(rubric: Rubric, rows: list[dict[str, Any]] = ROWS, **kwargs: Any) -> SingleTurnEnv:
    return SingleTurnEnv(dataset=rows, rubric=rubric, **kwargs)


async def run(
    rubric: Rubric,
    *,
    rows: list[dict[str, Any]] = ROWS,
    rollouts_per_example: int = 1,
    policy: Callable[..., Any] = reply_with_seed,
    **kwargs: Any,
) -> list[Rollout]:
    env = make_env(rubric, rows, **kwargs)
    return await env.run(ScriptedClient(policy), pa.RunSpec(rollouts_per_example=rollouts_per_example))


# --- weights -------------------------------------------------------------------------------------


def one() -> float:
    return 1.0


def half() -> float:
    return 0.5


async def test_reward_is_the_weighted_sum_and_metrics_are_raw_values() -> None:
    rollouts = await run(Rubric([one, half], weights=[2.0, -3.0]))
    for r in rollouts:
        assert r.metrics == {"one": 1.0, "half": 0.5}
        assert r.reward == pytest.approx(2.0 * 1.0 - 3.0 * 0.5)
        assert r.error is None


async def test_weights_default_to_one() -> None:
    rollouts = await run(Rubric([one, half]))
    assert [r.reward for r in rollouts] == [1.5, 1.5]


def test_weights_must_match_functions() -> None:
    with pytest.raises(ValueError, match="2 reward functions but 1 weights"):
        Rubric([one, half], weights=[1.0])


async def test_weight_zero_function_is_a_metric_not_part_of_the_reward() -> None:
    def length(completion: list[dict]) -> float:
        return float(len(completion[-1]["content"]))

    rollouts = await run(Rubric([one, length], weights=[1.0, 0.0]))
    for r in rollouts:
        assert r.metrics["length"] == len(r.completion[-1]["content"]) > 0
        assert r.reward == 1.0


async def test_async_reward_functions_are_awaited() -> None:
    async def correct(completion: list[dict], answer: str) -> float:
        return 1.0 if completion[-1]["content"] == answer else 0.0

    def policy(messages: list[dict]) -> str:
        return "4"

    rollouts = await run(Rubric([correct]), policy=policy)
    assert [r.metrics["correct"] for r in rollouts] == [1.0, 0.0]
    assert [r.reward for r in rollouts] == [1.0, 0.0]


async def test_int_and_bool_returns_count_as_numbers() -> None:
    def count() -> int:
        return 3

    def flag() -> bool:
        return True

    rollouts = await run(Rubric([count, flag]))
    assert rollouts[0].metrics == {"count": 3.0, "flag": 1.0}
    assert rollouts[0].reward == 4.0


# --- binding by name ------------------------------------------------------------------------------

EXPECTED: dict[str, Callable[[Rollout, SingleTurnEnv], Any]] = {
    "prompt": lambda r, env: r.prompt,
    "completion": lambda r, env: r.completion,
    "messages": lambda r, env: r.prompt + r.completion,
    "answer": lambda r, env: ROWS[r.example_id]["answer"],
    "state": lambda r, env: r.state,
    "info": lambda r, env: ROWS[r.example_id]["info"],
    "example": lambda r, env: env.examples[r.example_id],
    "parser": lambda r, env: env.parser,
    "rollout": lambda r, env: r,
    "example_id": lambda r, env: r.example_id,
    "rollout_index": lambda r, env: r.rollout_index,
    "difficulty": lambda r, env: ROWS[r.example_id]["difficulty"],  # a dataset column
}


def test_expected_covers_every_standard_argument() -> None:
    assert set(STANDARD_ARGS) <= set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_argument_is_bound_by_name(name: str) -> None:
    seen: list[dict[str, Any]] = []

    def probe(**kwargs: Any) -> float:
        seen.append(kwargs)
        return 0.0

    # as if declared `def probe(<name>)`: the binder reads the signature
    probe.__signature__ = inspect.Signature([inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY)])
    env = make_env(Rubric([probe]))
    rollouts = await env.run(ScriptedClient(reply_with_seed), pa.RunSpec(rollouts_per_example=2))
    assert len(seen) == len(rollouts) == 4
    for kwargs, rollout in zip(seen, rollouts, strict=True):
        assert list(kwargs) == [name]  # only what it asked for
        got = kwargs[name]
        expected = EXPECTED[name](rollout, env)
        if name in ("state", "example", "parser", "rollout"):
            assert got is expected
        else:
            assert got == expected


async def test_kwargs_function_gets_every_argument_and_column() -> None:
    seen: list[dict[str, Any]] = []

    def everything(**kwargs: Any) -> float:
        seen.append(kwargs)
        return 0.0

    rollouts = await run(Rubric([everything]))
    assert len(seen) == 2
    for kwargs, rollout in zip(seen, rollouts, strict=True):
        assert set(STANDARD_ARGS) | {"question", "difficulty"} <= set(kwargs)
        assert kwargs["rollout"] is rollout
        assert kwargs["difficulty"] == ROWS[rollout.example_id]["difficulty"]


async def test_named_arguments_and_kwargs_together() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def mixed(answer: str, **rest: Any) -> float:
        seen.append((answer, rest))
        return 0.0

    await run(Rubric([mixed]))
    assert [answer for answer, _ in seen] == ["4", "9"]
    assert all("completion" in rest for _, rest in seen)


def test_unknown_argument_is_rejected_when_the_environment_is_built() -> None:
    def grade(completion: list[dict], solution: str) -> float:
        return 0.0

    rubric = Rubric([grade])  # not checked yet: the dataset's columns are not known
    with pytest.raises(BindingError) as caught:
        make_env(rubric)
    assert "grade" in str(caught.value)
    assert "solution" in str(caught.value)


def test_a_dataset_column_makes_an_argument_known() -> None:
    def grade(solution: str) -> float:
        return 0.0

    make_env(Rubric([grade]), rows=[{"question": "q", "solution": "s"}])  # does not raise


async def test_argument_with_a_default_that_is_not_available_keeps_its_default() -> None:
    seen = []

    def grade(answer: str, bonus: float = 0.25) -> float:
        seen.append(bonus)
        return bonus

    rollouts = await run(Rubric([grade]))
    assert seen == [0.25, 0.25]
    assert rollouts[0].reward == 0.25


def test_duplicate_function_names_are_rejected() -> None:
    def score() -> float:
        return 1.0

    first = score

    def score() -> float:  # a second function with the same name, on purpose
        return 2.0

    with pytest.raises(ValueError, match="score"):
        Rubric([first, score])
    rubric = Rubric([first])
    with pytest.raises(ValueError, match="score"):
        rubric.add(score)


def test_unnamed_callables_are_rejected() -> None:
    class Scorer:
        def __call__(self) -> float:
            return 1.0

    with pytest.raises(TypeError):
        Rubric([Scorer()])


# --- group rewards --------------------------------------------------------------------------------


async def test_group_reward_gets_lists_and_scores_each_rollout() -> None:
    calls: list[dict[str, Any]] = []

    @group_reward
    def rank(completion: list[list[dict]], example_id: list[int], rollout_index: list[int]) -> list[float]:
        calls.append({"n": len(completion), "example_id": example_id, "rollout_index": rollout_index})
        return [float(10 * e + i) for e, i in zip(example_id, rollout_index, strict=True)]

    rollouts = await run(Rubric([rank]), rollouts_per_example=3)
    assert sorted(c["example_id"][0] for c in calls) == [0, 1]
    for call in calls:
        assert call["n"] == 3
        assert len(set(call["example_id"])) == 1
        assert call["rollout_index"] == [0, 1, 2]
    for r in rollouts:
        assert r.metrics["rank"] == 10 * r.example_id + r.rollout_index
        assert r.reward == 10 * r.example_id + r.rollout_index


async def test_group_and_plain_functions_mix() -> None:
    @group_reward
    async def share(completion: list[list[dict]]) -> list[float]:
        return [1.0 / len(completion)] * len(completion)

    rollouts = await run(Rubric([one, share], weights=[1.0, 2.0]), rollouts_per_example=4)
    assert all(r.reward == pytest.approx(1.0 + 2.0 * 0.25) for r in rollouts)


@pytest.mark.parametrize("result", [[1.0], [1.0, 2.0, 3.0], 1.0, None])
async def test_group_reward_returning_the_wrong_shape_is_a_recorded_error(result: Any) -> None:
    @group_reward
    def broken(completion: list[list[dict]]) -> Any:
        return result

    rollouts = await run(Rubric([one, broken]), rollouts_per_example=2)
    assert len(rollouts) == 4
    for r in rollouts:
        assert r.reward is None
        assert r.error is not None
        assert (r.error.type, r.error.stage) == (RewardError.__name__, "scoring")
        assert "broken" in r.error.message


async def test_group_reward_that_raises_fails_its_group_only() -> None:
    @group_reward
    def picky(example_id: list[int]) -> list[float]:
        if example_id[0] == 1:
            raise ZeroDivisionError("no")
        return [1.0] * len(example_id)

    rollouts = await run(Rubric([picky]), rollouts_per_example=2)
    for r in rollouts:
        if r.example_id == 1:
            assert r.reward is None
            assert r.error is not None and (r.error.type, r.error.stage) == ("ZeroDivisionError", "scoring")
        else:
            assert r.reward == 1.0 and r.error is None


# --- scoring errors -------------------------------------------------------------------------------


async def test_raising_reward_function_is_recorded_and_reward_is_none() -> None:
    def fragile(rollout_index: int) -> float:
        if rollout_index == 1:
            raise KeyError("missing")
        return 0.0

    rollouts = await run(Rubric([one, fragile]), rollouts_per_example=3)
    for r in rollouts:
        if r.rollout_index == 1:
            assert r.reward is None  # never silently 0
            assert r.error is not None
            assert (r.error.type, r.error.stage) == ("KeyError", "scoring")
            assert "fragile" in r.error.message and "missing" in r.error.message
            assert r.metrics["one"] == 1.0  # the functions that worked are still recorded
        else:
            assert r.reward == 1.0  # 1.0 + 0.0: the rest of the group is unaffected
            assert r.error is None


@pytest.mark.parametrize("value", ["1.0", None, [1.0], {"score": 1.0}])
async def test_non_numeric_return_is_a_recorded_error(value: Any) -> None:
    def wordy() -> Any:
        return value

    rollouts = await run(Rubric([one, wordy]))
    for r in rollouts:
        assert r.reward is None
        assert r.error is not None
        assert (r.error.type, r.error.stage) == (RewardError.__name__, "scoring")
        assert "wordy" in r.error.message


async def test_first_scoring_error_is_the_one_recorded() -> None:
    def first() -> float:
        raise ValueError("first")

    def second() -> float:
        raise ValueError("second")

    rollouts = await run(Rubric([first, second]))
    assert rollouts[0].error is not None and "first" in rollouts[0].error.message


# --- RubricGroup and parsers -----------------------------------------------------------------------


async def test_rubric_group_sums_rubrics() -> None:
    def three() -> float:
        return 3.0

    group = RubricGroup([Rubric([one, half], weights=[1.0, 2.0]), Rubric([three], weights=[0.5])])
    rollouts = await run(group)
    for r in rollouts:
        assert r.metrics == {"one": 1.0, "half": 0.5, "three": 3.0}
        assert r.reward == pytest.approx((1.0 + 2.0 * 0.5) + 0.5 * 3.0)


async def test_rubric_group_keeps_each_rubrics_parser() -> None:
    first_parser, second_parser, env_parser = Parser(), XMLParser(["answer"]), Parser()
    seen: dict[str, Any] = {}

    def uses_first(parser: Parser) -> float:
        seen["first"] = parser
        return 0.0

    def uses_second(parser: Parser) -> float:
        seen["second"] = parser
        return 0.0

    group = RubricGroup(
        [Rubric([uses_first], parser=first_parser), Rubric([uses_second], parser=second_parser)]
    )
    await run(group, parser=env_parser)
    assert seen["first"] is first_parser
    assert seen["second"] is second_parser


async def test_environment_parser_flows_to_a_rubric_built_without_one() -> None:
    env_parser = XMLParser(["answer"])
    seen = []

    def grade(parser: Parser) -> float:
        seen.append(parser)
        return 0.0

    await run(Rubric([grade]), parser=env_parser)
    assert seen and all(p is env_parser for p in seen)


async def test_rubric_with_its_own_parser_keeps_it_in_an_environment_with_another() -> None:
    own, env_parser = XMLParser(["answer"]), Parser()
    seen = []

    def grade(parser: Parser) -> float:
        seen.append(parser)
        return 0.0

    await run(Rubric([grade], parser=own), parser=env_parser)
    assert seen and all(p is own for p in seen)


async def test_environment_without_a_parser_uses_its_rubrics() -> None:
    own = XMLParser(["answer"])
    env = make_env(Rubric([one], parser=own))
    assert env.parser is own


async def test_function_added_with_its_own_parser_gets_it() -> None:
    own = XMLParser(["answer"])
    seen: dict[str, Any] = {}

    def special(parser: Parser) -> float:
        seen["special"] = parser
        return 0.0

    def plain(parser: Parser) -> float:
        seen["plain"] = parser
        return 0.0

    rubric = Rubric([plain])
    rubric.add(special, 1.0, parser=own)
    env = make_env(rubric)
    await env.run(ScriptedClient(reply_with_seed), pa.RunSpec(num_examples=1))
    assert seen["special"] is own
    assert seen["plain"] is env.parser


async def test_environment_parser_flows_to_a_parserless_rubric_inside_a_group() -> None:
    env_parser = XMLParser(["answer"])
    seen = []

    def grade(parser: Parser) -> float:
        seen.append(parser)
        return 0.0

    await run(RubricGroup([Rubric([grade])]), parser=env_parser)
    assert seen and all(p is env_parser for p in seen)
