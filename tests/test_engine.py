"""Tests for the engine behind env.run / env.stream: coverage, seeds, limits, groups, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from typing import Any

import pytest

import palaestra as pa
from palaestra import (
    DatasetError,
    MultiTurnEnv,
    Rollout,
    Rubric,
    ScriptedClient,
    SingleTurnEnv,
    State,
    group_reward,
    stop,
)
from palaestra.types import Messages


def rows(n: int) -> list[dict[str, Any]]:
    return [{"question": f"q{i}", "answer": str(i)} for i in range(n)]


def correct(completion: Messages, answer: str) -> float:
    return 1.0 if answer in completion[-1]["content"] else 0.0


class InFlight:
    """A scripted policy that counts its concurrent calls; each call sleeps ``delay`` seconds."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.now = 0
        self.peak = 0
        self.started = 0
        self.finished = 0

    async def __call__(self, messages: Messages) -> str:
        self.now += 1
        self.started += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.now -= 1
        self.finished += 1
        return f"answer {messages[-1]['content'][1:]}"


def single_turn(n: int, *funcs: Any) -> SingleTurnEnv:
    return SingleTurnEnv(dataset=rows(n), rubric=Rubric(list(funcs) or [correct]))


class Dice(MultiTurnEnv):
    """A game whose length and replies come from the seeded rngs of the policy and the env."""

    async def setup_state(self, state: State) -> None:
        state["target"] = state.rng.randint(1, 6)

    async def env_response(self, messages: Messages, state: State) -> Messages:
        return [{"role": "user", "content": f"roll again ({state.rng.randint(1, 100)})"}]

    @stop
    def hit(self, messages: Messages, state: State) -> bool:
        return bool(state.turn) and messages[-1]["content"] == f"rolled {state['target']}"


async def dice_policy(messages: Messages, rng: random.Random) -> str:
    await asyncio.sleep(rng.random() * 0.003)  # scramble completion order
    return f"rolled {rng.randint(1, 6)}"


def lucky(state: dict[str, Any], completion: Messages) -> float:
    return float(len(completion)) + state["target"] / 10


def comparable(rollouts: list[Rollout]) -> list[dict[str, Any]]:
    """The rollouts as saved, minus wall-clock times."""
    out = []
    for r in rollouts:
        data = r.to_dict()
        del data["timing"]
        for turn in data["turns"]:
            del turn["model_time"], turn["env_time"]
        out.append(data)
    return out


async def dice_run(*, seed: int, max_concurrent: int = 8) -> list[Rollout]:
    env = Dice(dataset=rows(6), max_turns=8, rubric=Rubric([lucky]))
    return await env.run(
        ScriptedClient(dice_policy),
        pa.RunSpec(rollouts_per_example=3, seed=seed, max_concurrent=max_concurrent),
    )


def other_tasks() -> set[asyncio.Task[Any]]:
    current = asyncio.current_task()
    return {t for t in asyncio.all_tasks() if t is not current and not t.done()}


# --- what a run returns --------------------------------------------------------------------------


async def test_run_returns_every_rollout_once_in_order() -> None:
    policy = InFlight()
    env = single_turn(5)
    rollouts = await env.run(ScriptedClient(policy), pa.RunSpec(num_examples=3, rollouts_per_example=4))
    keys = [(r.example_id, r.rollout_index) for r in rollouts]
    assert keys == [(e, i) for e in range(3) for i in range(4)]
    assert policy.started == 12
    assert all(r.reward == 1.0 and r.error is None for r in rollouts)


async def test_run_sorts_rollouts_that_finish_out_of_order() -> None:
    async def slower_first(messages: Messages) -> str:
        await asyncio.sleep(0.02 * (5 - int(messages[-1]["content"][1:])))
        return "x"

    delivered: list[int] = []
    rollouts = await single_turn(5).run(
        ScriptedClient(slower_first), on_rollout=lambda r: delivered.append(r.example_id)
    )
    assert delivered == [4, 3, 2, 1, 0]  # delivered as they finish
    assert [r.example_id for r in rollouts] == [0, 1, 2, 3, 4]


async def test_on_rollout_is_called_once_per_rollout_with_reward_set() -> None:
    seen: list[tuple[int, int, float | None]] = []

    def record(rollout: Rollout) -> None:
        seen.append((rollout.example_id, rollout.rollout_index, rollout.reward))

    rollouts = await single_turn(3).run(
        ScriptedClient(InFlight()), pa.RunSpec(rollouts_per_example=2), on_rollout=record
    )
    assert sorted(seen) == [(r.example_id, r.rollout_index, 1.0) for r in rollouts]


async def test_async_on_rollout_is_awaited() -> None:
    seen: list[tuple[int, int]] = []

    async def record(rollout: Rollout) -> None:
        await asyncio.sleep(0)
        assert rollout.reward is not None and rollout.metrics["correct"] == 1.0
        seen.append((rollout.example_id, rollout.rollout_index))

    await single_turn(3).run(
        ScriptedClient(InFlight()), pa.RunSpec(rollouts_per_example=2), on_rollout=record
    )
    assert sorted(seen) == [(e, i) for e in range(3) for i in range(2)]


async def test_stream_yields_each_scored_rollout_once_group_by_group() -> None:
    env = single_turn(4)
    streamed = [r async for r in env.stream(ScriptedClient(InFlight()), pa.RunSpec(rollouts_per_example=3))]
    assert Counter((r.example_id, r.rollout_index) for r in streamed) == Counter(
        (e, i) for e in range(4) for i in range(3)
    )
    assert all(r.reward == 1.0 for r in streamed)
    example_ids = [r.example_id for r in streamed]
    for k in range(0, 12, 3):  # a group's rollouts arrive together
        assert len(set(example_ids[k : k + 3])) == 1


async def test_failed_rollouts_are_returned_not_raised() -> None:
    def policy(messages: Messages) -> str:
        if messages[-1]["content"] == "q1":
            raise ConnectionError("refused")
        return "answer"

    rollouts = await single_turn(3).run(ScriptedClient(policy))
    assert [r.error.stage if r.error else None for r in rollouts] == [None, "model", None]
    assert rollouts[1].error is not None and rollouts[1].error.type == "ConnectionError"
    assert rollouts[0].reward is not None and rollouts[2].reward is not None


# --- seeds -----------------------------------------------------------------------------------------


async def test_same_seed_gives_identical_rollouts() -> None:
    first, second = await dice_run(seed=3), await dice_run(seed=3)
    assert comparable(first) == comparable(second)
    assert len({len(r.turns) for r in first}) > 1  # the episodes really depend on the rngs


async def test_different_seed_gives_different_rollouts() -> None:
    first, other = await dice_run(seed=3), await dice_run(seed=4)
    assert comparable(first) != comparable(other)
    assert [r.seed for r in first] != [r.seed for r in other]


async def test_results_do_not_depend_on_max_concurrent() -> None:
    serial, parallel = await dice_run(seed=5, max_concurrent=1), await dice_run(seed=5, max_concurrent=64)
    assert comparable(serial) == comparable(parallel)


# --- concurrency limits ------------------------------------------------------------------------------


async def test_max_concurrent_bounds_requests_in_flight() -> None:
    policy = InFlight(delay=0.02)
    await single_turn(10).run(ScriptedClient(policy), pa.RunSpec(max_concurrent=3))
    assert policy.peak == 3
    assert policy.started == 10


async def test_max_concurrent_counts_requests_not_groups() -> None:
    policy = InFlight(delay=0.02)
    await single_turn(1).run(ScriptedClient(policy), pa.RunSpec(rollouts_per_example=4, max_concurrent=2))
    assert policy.peak == 2
    policy = InFlight(delay=0.02)
    await single_turn(2).run(ScriptedClient(policy), pa.RunSpec(rollouts_per_example=4, max_concurrent=64))
    assert policy.peak == 8  # all requests at once when the limit allows


async def test_a_rollout_in_its_env_turn_holds_no_request_slot() -> None:
    in_env = 0
    overlapped = []

    class SlowEnv(MultiTurnEnv):
        async def env_response(self, messages: Messages, state: State) -> Messages:
            nonlocal in_env
            in_env += 1
            try:
                await asyncio.sleep(0.02)
            finally:
                in_env -= 1
            return [{"role": "user", "content": "q again"}]

    async def policy() -> str:
        overlapped.append(in_env > 0)
        await asyncio.sleep(0.001)
        return "x"

    env = SlowEnv(dataset=rows(4), max_turns=3, rubric=Rubric([correct]))
    await env.run(ScriptedClient(policy), pa.RunSpec(max_concurrent=1))
    assert len(overlapped) == 12
    assert any(overlapped)  # a request ran while another rollout was in its env turn


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rollouts_per_example": 0}, "rollouts_per_example"),
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"max_concurrent": -1}, "max_concurrent"),
        ({"num_examples": 0}, "num_examples is 0"),
        ({"seed": 2**64}, "seed"),
        ({"rollouts_per_example": True}, "rollouts_per_example"),
    ],
)
def test_invalid_run_specs_raise_clear_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pa.RunSpec(**kwargs)


async def test_empty_dataset_is_a_clear_error() -> None:
    with pytest.raises(DatasetError, match="empty"):
        await SingleTurnEnv(dataset=[]).run(ScriptedClient(InFlight()))


# --- groups ---------------------------------------------------------------------------------------


async def test_group_reward_sees_exactly_one_examples_rollouts() -> None:
    groups: list[tuple[list[int], list[int]]] = []

    @group_reward
    def relative(example_id: list[int], rollout_index: list[int]) -> list[float]:
        groups.append((example_id, rollout_index))
        return [0.0] * len(example_id)

    await single_turn(5, relative).run(
        ScriptedClient(InFlight()), pa.RunSpec(rollouts_per_example=3, max_concurrent=2)
    )
    assert sorted(ids[0] for ids, _ in groups) == [0, 1, 2, 3, 4]
    for ids, indices in groups:
        assert ids == [ids[0]] * 3
        assert indices == [0, 1, 2]


# --- cancellation -----------------------------------------------------------------------------------


async def test_cancelling_a_run_cancels_every_pending_rollout() -> None:
    policy = InFlight(delay=0.01)
    delivered: list[Rollout] = []
    enough = asyncio.Event()

    def record(rollout: Rollout) -> None:
        delivered.append(rollout)
        if len(delivered) >= 3:
            enough.set()

    env = single_turn(40)
    task = asyncio.create_task(
        env.run(ScriptedClient(policy), pa.RunSpec(max_concurrent=2), on_rollout=record)
    )
    await enough.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert other_tasks() == set()
    assert policy.now == 0
    assert 3 <= len(delivered) < 40
    assert policy.started < 40  # the rest were cancelled, not run to the end
    assert all(r.reward is not None and r.error is None for r in delivered)
    started = policy.started
    await asyncio.sleep(0.03)
    assert policy.started == started  # nothing runs on after the cancellation


async def test_breaking_out_of_stream_cancels_the_rest() -> None:
    policy = InFlight(delay=0.01)
    env = single_turn(30)
    async for rollout in env.stream(ScriptedClient(policy), pa.RunSpec(max_concurrent=4)):
        assert rollout.reward == 1.0
        break
    await asyncio.sleep(0.02)  # the abandoned generator is closed by the event loop
    assert policy.now == 0
    assert other_tasks() == set()
    started = policy.started
    await asyncio.sleep(0.03)
    assert policy.started == started < 30


async def test_closing_a_stream_cancels_the_rest_at_once() -> None:
    policy = InFlight(delay=0.01)
    env = single_turn(30)
    async with contextlib.aclosing(
        env.stream(ScriptedClient(policy), pa.RunSpec(max_concurrent=4))
    ) as stream:
        async for _ in stream:
            break
    assert policy.now == 0
    assert other_tasks() == set()


async def test_raising_on_rollout_propagates_and_cancels_the_rest() -> None:
    policy = InFlight(delay=0.01)

    def explode(rollout: Rollout) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        await single_turn(30).run(ScriptedClient(policy), pa.RunSpec(max_concurrent=4), on_rollout=explode)
    assert policy.now == 0
    assert other_tasks() == set()
    started = policy.started
    await asyncio.sleep(0.03)
    assert policy.started == started < 30


# --- a custom environment only talks to a client --------------------------------------------------


class Ask(pa.Environment):
    """A custom episode: two requests per rollout, no limiter, no timeout handling of its own."""

    async def episode(
        self, client: pa.ModelClient, rollout: Rollout, state: State, sampling: pa.Sampling
    ) -> None:
        for _ in range(2):
            reply = await client.chat(rollout.messages, sampling=sampling)
            rollout.completion.append(reply.message)
        if rollout.completion[-1]["content"] == "raise":
            raise KeyError("the episode's own bug")


async def test_a_custom_episode_gets_a_client_limited_by_the_engine() -> None:
    policy = InFlight(delay=0.02)
    rollouts = await Ask(dataset=rows(6)).run(ScriptedClient(policy), pa.RunSpec(max_concurrent=2))
    assert policy.peak == 2 and policy.finished == 12
    assert all(len(r.completion) == 2 and r.error is None for r in rollouts)


async def test_a_custom_episode_waits_for_slots_outside_its_timeout_and_its_errors_are_recorded() -> None:
    async def policy(messages: Messages) -> str:
        await asyncio.sleep(0.05)
        return "raise" if messages[0]["content"] == "q3" else "ok"

    env = Ask(dataset=rows(4), timeout=0.15)  # own time 0.1 s; the last waits ~0.3 s for the slot
    rollouts = await env.run(ScriptedClient(policy), pa.RunSpec(max_concurrent=1))
    assert [r.error is None for r in rollouts] == [True, True, True, False]
    error = rollouts[3].error
    assert error is not None and (error.type, error.stage) == ("KeyError", "env")
    assert rollouts[3].stop_reason == "error" and len(rollouts[3].completion) == 2  # work kept


async def test_a_model_error_raised_through_a_custom_episode_has_stage_model() -> None:
    def policy() -> str:
        raise pa.ModelConnectionError("server gone")

    (rollout,) = await Ask(dataset=rows(1)).run(ScriptedClient(policy))
    assert rollout.error is not None and (rollout.error.type, rollout.error.stage) == (
        "ModelConnectionError",
        "model",
    )


# --- groups start a bounded number at a time --------------------------------------------------------


async def test_groups_start_in_order_a_bounded_number_at_a_time() -> None:
    groups_done_when_started: dict[int, int] = {}
    done: list[int] = []

    async def policy(messages: Messages) -> str:
        groups_done_when_started.setdefault(int(messages[-1]["content"][1:]), len(done) // 2)
        await asyncio.sleep(0.005)
        return "x"

    spec = pa.RunSpec(rollouts_per_example=2, max_concurrent=4)
    await single_turn(40).run(ScriptedClient(policy), spec, on_rollout=lambda r: done.append(r.example_id))
    in_flight = pa.engine.groups_in_flight(spec)
    assert in_flight == 4 and list(groups_done_when_started) == list(range(40))  # started in order
    # example k starts only once k - in_flight groups are done: progress is saved from the start
    assert all(groups_done_when_started[k] >= k - in_flight for k in range(40))
