"""Tests for palaestra.envs: building examples from datasets, and the multi-turn rollout loop."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import datasets
import pytest

import palaestra as pa
from palaestra import (
    DatasetError,
    Final,
    ModelResponse,
    MultiTurnEnv,
    Rollout,
    Sampling,
    ScriptedClient,
    SingleTurnEnv,
    State,
    Usage,
    derive_seed,
    stop,
)
from palaestra.types import Messages

SYSTEM = {"role": "system", "content": "Answer with a number."}
FEW_SHOT = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def prompt_of(row: dict[str, Any], **kwargs: Any) -> Messages:
    return SingleTurnEnv(dataset=[row], **kwargs).examples[0].prompt


def echo(messages: Messages) -> str:
    """A policy that repeats the last message's text."""
    return f"echo {messages[-1]['content']}"


class Counter(MultiTurnEnv):
    """Replies to each model turn with 'turn <k>'."""

    async def env_response(self, messages: Messages, state: State) -> Messages:
        return [user(f"turn {state.turn}")]


async def play(env: MultiTurnEnv, policy: Any = echo, **kwargs: Any) -> Rollout:
    """One rollout of the first example."""
    return await env.rollout(ScriptedClient(policy), env.examples[0], **kwargs)


# --- building examples ----------------------------------------------------------------------------


def test_question_becomes_the_user_message() -> None:
    assert prompt_of({"question": "2+2?"}) == [user("2+2?")]


def test_non_string_question_is_made_text() -> None:
    assert prompt_of({"question": 17}) == [user("17")]


def test_system_prompt_and_few_shot_go_before_the_question() -> None:
    prompt = prompt_of({"question": "2+2?"}, system_prompt=SYSTEM["content"], few_shot=FEW_SHOT)
    assert prompt == [SYSTEM, *FEW_SHOT, user("2+2?")]


def test_string_prompt_is_the_user_message() -> None:
    assert prompt_of({"prompt": "2+2?"}) == [user("2+2?")]
    prompt = prompt_of({"prompt": "2+2?"}, system_prompt=SYSTEM["content"], few_shot=FEW_SHOT)
    assert prompt == [SYSTEM, *FEW_SHOT, user("2+2?")]


def test_message_list_prompt_without_system_gets_system_prompt_and_few_shot() -> None:
    messages = [user("hi"), {"role": "assistant", "content": "hello"}, user("2+2?")]
    prompt = prompt_of({"prompt": messages}, system_prompt=SYSTEM["content"], few_shot=FEW_SHOT)
    assert prompt == [SYSTEM, *FEW_SHOT, *messages]
    assert prompt_of({"prompt": messages}) == messages


def test_message_list_prompt_with_its_own_system_message_keeps_it() -> None:
    own = {"role": "system", "content": "You are a pirate."}
    prompt = prompt_of({"prompt": [own, user("2+2?")]}, system_prompt=SYSTEM["content"])
    assert prompt == [own, user("2+2?")]  # the environment's system prompt is not added


def test_few_shot_never_goes_before_a_prompts_own_system_message() -> None:
    own = {"role": "system", "content": "You are a pirate."}
    prompt = prompt_of({"prompt": [own, user("2+2?")]}, system_prompt=SYSTEM["content"], few_shot=FEW_SHOT)
    assert prompt[0] == own
    assert prompt == [own, *FEW_SHOT, user("2+2?")]


def test_prompt_messages_are_copied_from_the_row() -> None:
    message = user("2+2?")
    env = SingleTurnEnv(dataset=[{"prompt": [message]}])
    env.examples[0].prompt[0]["content"] = "changed"
    assert message["content"] == "2+2?"


def test_answer_info_and_columns_are_carried() -> None:
    row = {"question": "2+2?", "answer": "4", "info": {"level": 1}, "source": "gsm"}
    example = SingleTurnEnv(dataset=[row]).examples[0]
    assert example.id == 0
    assert example.answer == "4"
    assert example.info == {"level": 1}
    assert example.row == row


def test_answer_and_info_are_optional() -> None:
    example = SingleTurnEnv(dataset=[{"question": "q"}]).examples[0]
    assert example.answer is None and example.info == {}


def test_row_without_prompt_or_question_names_the_row() -> None:
    rows = [{"question": "ok"}, {"text": "no prompt here"}]
    with pytest.raises(DatasetError, match=r"row 1\b.*text"):
        SingleTurnEnv(dataset=rows)


def test_info_that_is_not_a_dict_is_rejected() -> None:
    with pytest.raises(DatasetError, match=r"row 0.*info"):
        SingleTurnEnv(dataset=[{"question": "q", "info": "level 1"}])


@pytest.mark.parametrize("bad", [17, [{"content": "no role"}], ["just text"]])
def test_prompt_of_the_wrong_type_is_rejected(bad: Any) -> None:
    with pytest.raises(DatasetError, match=r"row 0.*prompt"):
        SingleTurnEnv(dataset=[{"prompt": bad}])


def test_hugging_face_dataset_gives_the_same_examples_as_a_list() -> None:
    rows = [
        {"prompt": [user("2+2?")], "answer": "4", "info": {"level": 1}},
        {"prompt": [SYSTEM, user("3*3?")], "answer": "9", "info": {"level": 2}},
    ]
    from_list = SingleTurnEnv(dataset=rows, few_shot=FEW_SHOT, system_prompt="Be brief.")
    from_hf = SingleTurnEnv(
        dataset=datasets.Dataset.from_list(rows), few_shot=FEW_SHOT, system_prompt="Be brief."
    )
    assert from_hf.examples == from_list.examples


def test_select_takes_the_first_n_examples() -> None:
    env = SingleTurnEnv(dataset=[{"question": str(i)} for i in range(5)])
    assert [e.id for e in env.select(3)] == [0, 1, 2]
    assert [e.id for e in env.select()] == [0, 1, 2, 3, 4]
    assert [e.id for e in env.select(10)] == [0, 1, 2, 3, 4]
    with pytest.raises(DatasetError):
        env.select(0)
    with pytest.raises(DatasetError):
        SingleTurnEnv(dataset=[]).select()


# --- MultiTurnEnv: the loop -------------------------------------------------------------------------


async def test_env_responses_are_appended_and_seen_by_the_model() -> None:
    seen: list[Messages] = []

    def policy(messages: Messages) -> str:
        seen.append([dict(m) for m in messages])
        return f"reply {len(seen)}"

    env = Counter(dataset=[{"question": "go"}], max_turns=3)
    rollout = await play(env, policy)
    assert rollout.completion == [
        {"role": "assistant", "content": "reply 1"},
        user("turn 1"),
        {"role": "assistant", "content": "reply 2"},
        user("turn 2"),
        {"role": "assistant", "content": "reply 3"},
        user("turn 3"),  # the environment answers the reply that reaches max_turns too
    ]
    assert seen[2] == rollout.prompt + rollout.completion[:4]
    assert rollout.stop_reason == "max_turns"
    assert len(rollout.turns) == 3
    assert rollout.error is None


def test_max_turns_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_turns"):
        Counter(dataset=[{"question": "q"}], max_turns=0)


async def test_setup_state_sees_example_and_seeded_rng() -> None:
    class Secret(MultiTurnEnv):
        async def setup_state(self, state: State) -> None:
            state["example_id"] = state.example.id
            state["secret"] = state.rng.randint(0, 10**9)

        async def env_response(self, messages: Messages, state: State) -> Messages:
            return [user(f"secret is {state['secret']}")]

    env = Secret(dataset=[{"question": "a"}, {"question": "b"}], max_turns=2)
    rollout = await env.rollout(ScriptedClient(echo), env.examples[1], rollout_index=3, seed=7)
    expected = random.Random(derive_seed(7, 1, 3)).randint(0, 10**9)
    assert rollout.seed == derive_seed(7, 1, 3)
    assert rollout.state["example_id"] == 1
    assert rollout.state["secret"] == expected
    assert rollout.completion[1] == user(f"secret is {expected}")


async def test_stop_condition_names_the_stop_reason() -> None:
    class Guess(Counter):
        @stop
        def solved(self, messages: Messages, state: State) -> bool:
            return messages[-1]["content"] == "echo turn 2"

    rollout = await play(Guess(dataset=[{"question": "go"}], max_turns=10))
    assert rollout.stop_reason == "solved"
    assert len(rollout.turns) == 3


async def test_higher_priority_stop_condition_wins() -> None:
    class Both(Counter):
        @stop
        def aaa_low(self, state: State) -> bool:
            return state.turn >= 1

        @stop(priority=10)
        def zzz_high(self, state: State) -> bool:
            return state.turn >= 1

    rollout = await play(Both(dataset=[{"question": "go"}]))
    assert rollout.stop_reason == "zzz_high"
    assert len(rollout.turns) == 1


async def test_stop_conditions_are_checked_before_the_first_turn() -> None:
    calls = []

    def policy(messages: Messages) -> str:
        calls.append(messages)
        return "never"

    class AlreadyOver(Counter):
        async def setup_state(self, state: State) -> None:
            state["over"] = True

        @stop
        def game_over(self, state: State) -> bool:
            return state["over"]

    rollout = await play(AlreadyOver(dataset=[{"question": "go"}]), policy)
    assert calls == []
    assert rollout.turns == [] and rollout.completion == []
    assert rollout.stop_reason == "game_over"


async def test_final_ends_the_episode_with_its_messages_and_reason() -> None:
    class OneRound(MultiTurnEnv):
        async def env_response(self, messages: Messages, state: State) -> Final:
            return Final([user("you win")], reason="won")

    rollout = await play(OneRound(dataset=[{"question": "go"}], max_turns=5))
    assert rollout.completion == [{"role": "assistant", "content": "echo go"}, user("you win")]
    assert rollout.stop_reason == "won"
    assert len(rollout.turns) == 1
    assert rollout.error is None


async def test_final_has_a_default_reason() -> None:
    class OneRound(MultiTurnEnv):
        async def env_response(self, messages: Messages, state: State) -> Final:
            return Final([])

    rollout = await play(OneRound(dataset=[{"question": "go"}]))
    assert rollout.stop_reason == "env_final"


async def test_env_response_error_is_recorded_and_messages_kept() -> None:
    class Flaky(Counter):
        async def env_response(self, messages: Messages, state: State) -> Messages:
            if state.turn == 2:
                raise KeyError("no such cell")
            return await super().env_response(messages, state)

    rollout = await play(Flaky(dataset=[{"question": "go"}], max_turns=5))
    assert rollout.error is not None
    assert (rollout.error.type, rollout.error.stage) == ("KeyError", "env")
    assert "env_response" in rollout.error.message and "no such cell" in rollout.error.message
    assert rollout.stop_reason == "error"
    assert rollout.completion == [
        {"role": "assistant", "content": "echo go"},
        user("turn 1"),
        {"role": "assistant", "content": "echo turn 1"},
    ]
    assert len(rollout.turns) == 2


async def test_setup_state_error_is_recorded() -> None:
    calls = []

    class Broken(Counter):
        async def setup_state(self, state: State) -> None:
            raise RuntimeError("no board")

    rollout = await play(Broken(dataset=[{"question": "go"}]), lambda: calls.append(1) or "x")
    assert rollout.error is not None
    assert (rollout.error.type, rollout.error.stage) == ("RuntimeError", "env")
    assert "no board" in rollout.error.message
    assert calls == [] and rollout.turns == []


async def test_stop_condition_error_is_recorded() -> None:
    class BadStop(Counter):
        @stop
        def finished(self, state: State) -> bool:
            return state["missing"]

    rollout = await play(BadStop(dataset=[{"question": "go"}]))
    assert rollout.error is not None
    assert (rollout.error.type, rollout.error.stage) == ("KeyError", "env")
    assert "finished" in rollout.error.message
    assert rollout.stop_reason == "error"


@pytest.mark.parametrize("reply", ["turn 1", {"role": "user", "content": "turn 1"}, None])
async def test_env_response_that_is_not_a_list_is_an_error(reply: Any) -> None:
    class Sloppy(MultiTurnEnv):
        async def env_response(self, messages: Messages, state: State) -> Any:
            return reply

    rollout = await play(Sloppy(dataset=[{"question": "go"}], max_turns=3))
    assert rollout.error is not None
    assert (rollout.error.type, rollout.error.stage) == ("TypeError", "env")
    assert rollout.stop_reason == "error"
    assert rollout.completion == [{"role": "assistant", "content": "echo go"}]


async def test_model_error_is_recorded_with_its_type_and_earlier_turns_kept() -> None:
    calls = []

    def policy(messages: Messages) -> str:
        calls.append(1)
        if len(calls) == 2:
            raise ConnectionResetError("server went away")
        return "fine"

    rollout = await play(Counter(dataset=[{"question": "go"}], max_turns=5), policy)
    assert rollout.error is not None
    assert rollout.error.type == "ConnectionResetError"
    assert rollout.error.stage == "model"
    assert "server went away" in rollout.error.message
    assert rollout.stop_reason == "error"
    assert len(rollout.turns) == 1
    assert rollout.completion == [{"role": "assistant", "content": "fine"}, user("turn 1")]


async def test_env_methods_exceptions_do_not_escape_run() -> None:
    class Broken(MultiTurnEnv):
        async def env_response(self, messages: Messages, state: State) -> Messages:
            raise RuntimeError("bug")

    rollouts = await Broken(dataset=[{"question": "a"}, {"question": "b"}]).run(ScriptedClient(echo))
    assert [r.error.stage if r.error else None for r in rollouts] == ["env", "env"]


# --- timeouts --------------------------------------------------------------------------------------


async def test_rollout_timeout_keeps_turns_before_it() -> None:
    calls = []

    async def policy(messages: Messages) -> str:
        calls.append(1)
        if len(calls) == 3:
            await asyncio.sleep(5)
        return "ok"

    env = Counter(dataset=[{"question": "go"}], max_turns=10, timeout=0.2)
    rollout = await play(env, policy)
    assert rollout.stop_reason == "timeout"
    assert rollout.error is not None
    assert (rollout.error.type, rollout.error.stage) == ("RolloutTimeout", "timeout")
    assert len(rollout.turns) == 2
    assert len(rollout.completion) == 4
    assert rollout.timing.total < 2


async def test_timeout_covers_a_slow_env_response() -> None:
    class Slow(MultiTurnEnv):
        async def env_response(self, messages: Messages, state: State) -> Messages:
            await asyncio.sleep(5)
            return []

    rollout = await play(Slow(dataset=[{"question": "go"}], timeout=0.1))
    assert rollout.stop_reason == "timeout"
    assert rollout.error is not None and rollout.error.stage == "timeout"
    assert rollout.completion == [{"role": "assistant", "content": "echo go"}]


async def test_waiting_for_a_request_slot_does_not_count_against_the_timeout() -> None:
    async def policy() -> str:
        await asyncio.sleep(0.1)
        return "done"

    env = SingleTurnEnv(dataset=[{"question": str(i)} for i in range(5)], timeout=0.3)
    rollouts = await env.run(ScriptedClient(policy), pa.RunSpec(max_concurrent=1))
    # each rollout's own time is 0.1 s; the last waits 0.4 s for the single slot
    assert [r.stop_reason for r in rollouts] == ["answered"] * 5
    assert all(r.error is None for r in rollouts)


async def test_own_time_still_times_out_under_a_concurrency_limit() -> None:
    async def policy() -> str:
        await asyncio.sleep(5)
        return "late"

    env = SingleTurnEnv(dataset=[{"question": "a"}, {"question": "b"}], timeout=0.1)
    rollouts = await env.run(ScriptedClient(policy), pa.RunSpec(max_concurrent=2))
    assert [r.stop_reason for r in rollouts] == ["timeout", "timeout"]


# --- turn records and seeds ---------------------------------------------------------------------------


async def test_turn_records_what_the_model_returned() -> None:
    async def policy(messages: Messages) -> ModelResponse:
        await asyncio.sleep(0.01)
        k = len(messages)
        return ModelResponse(
            message={"role": "assistant", "content": f"r{k}"},
            finish_reason="length" if k > 3 else "stop",
            usage=Usage(prompt_tokens=k, completion_tokens=2),
            token_ids=[k, k + 1],
            logprobs=[-0.5, -0.25],
        )

    env = Counter(dataset=[{"question": "go"}], system_prompt="sys", max_turns=3)
    rollout = await play(env, policy)
    assert [t.index for t in rollout.turns] == [0, 1, 2]
    assert [t.prompt_messages for t in rollout.turns] == [2, 4, 6]  # messages before each reply
    assert [t.finish_reason for t in rollout.turns] == ["stop", "length", "length"]
    assert [t.usage for t in rollout.turns] == [Usage(2, 2), Usage(4, 2), Usage(6, 2)]
    assert [t.token_ids for t in rollout.turns] == [[2, 3], [4, 5], [6, 7]]
    assert all(t.logprobs == [-0.5, -0.25] for t in rollout.turns)
    assert all(t.model_time >= 0.01 for t in rollout.turns)
    assert rollout.usage == Usage(prompt_tokens=12, completion_tokens=6)
    assert rollout.timing.model == pytest.approx(sum(t.model_time for t in rollout.turns))
    assert rollout.timing.total >= rollout.timing.model
    for turn in rollout.turns:  # each turn's reply sits right after the messages it was given
        reply = rollout.messages[turn.prompt_messages]
        assert reply["content"] == f"r{turn.prompt_messages}"


async def test_request_seeds_differ_per_turn_and_rollout_and_are_reproducible() -> None:
    async def seeds_of(run_seed: int) -> list[list[int]]:
        seen: dict[str, list[int]] = {}

        def policy(messages: Messages, sampling: Sampling) -> str:
            seen.setdefault(messages[0]["content"], []).append(sampling.seed)
            return "ok"

        env = Counter(dataset=[{"question": "a"}, {"question": "b"}], max_turns=3)
        rollouts = await env.run(ScriptedClient(policy), pa.RunSpec(rollouts_per_example=2, seed=run_seed))
        assert len(rollouts) == 4
        return [seen["a"], seen["b"]]

    first = await seeds_of(0)
    flat = [s for per_example in first for s in per_example]
    assert len(flat) == 12 and len(set(flat)) == 12
    assert all(isinstance(s, int) for s in flat)
    again = await seeds_of(0)
    assert sorted(again[0]) == sorted(first[0]) and sorted(again[1]) == sorted(first[1])
    other = await seeds_of(1)
    assert not set(flat) & {s for per_example in other for s in per_example}


async def test_sampling_arguments_reach_the_client_with_a_seed() -> None:
    seen: list[Sampling] = []

    def policy(sampling: Sampling) -> str:
        seen.append(sampling)
        return "ok"

    env = SingleTurnEnv(dataset=[{"question": "q"}], sampling=Sampling(temperature=0.3, max_tokens=9))
    await env.run(ScriptedClient(policy))
    await env.run(ScriptedClient(policy), pa.RunSpec(sampling=Sampling(temperature=1.0)))
    assert (seen[0].temperature, seen[0].max_tokens) == (0.3, 9)
    assert (seen[1].temperature, seen[1].max_tokens) == (1.0, None)
    assert seen[0].seed is not None
    assert env.sampling.seed is None  # the environment's defaults are not modified


async def test_tools_are_passed_to_the_client() -> None:
    tools = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}]
    seen = []

    def policy(tools: Any) -> str:
        seen.append(tools)
        return "ok"

    await SingleTurnEnv(dataset=[{"question": "q"}], tools=tools).run(ScriptedClient(policy))
    assert seen == [tools]


async def test_rollout_does_not_modify_the_example() -> None:
    env = Counter(dataset=[{"question": "go", "info": {"level": 1}}], max_turns=2)
    before = json.dumps([env.examples[0].prompt, env.examples[0].info])
    rollouts = await env.run(ScriptedClient(echo), pa.RunSpec(rollouts_per_example=3))
    rollouts[0].prompt.append(user("later edit"))
    rollouts[0].info["level"] = 99
    assert json.dumps([env.examples[0].prompt, env.examples[0].info]) == before


async def test_a_real_rollout_serialises_to_json() -> None:
    class WithState(Counter):
        async def setup_state(self, state: State) -> None:
            state["board"] = {(0, 0): "x"}  # tuple keys JSON cannot hold
            state["moves"] = [1, 2]

    rollouts = await WithState(dataset=[{"question": "go"}], max_turns=2).run(ScriptedClient(echo))
    data = json.loads(json.dumps(rollouts[0].to_dict()))
    assert data["state"]["moves"] == [1, 2]
    assert data["state"]["board"] == {"(0, 0)": "x"}
    restored = Rollout.from_dict(data)
    assert restored.completion == rollouts[0].completion
    assert restored.turns == rollouts[0].turns


# --- SingleTurnEnv ------------------------------------------------------------------------------------


async def test_single_turn_env_has_one_turn_and_stops_answered() -> None:
    calls = []

    def policy(messages: Messages) -> str:
        calls.append(list(messages))
        return "4"

    env = SingleTurnEnv(dataset=[{"question": "2+2?", "answer": "4"}], system_prompt="Be brief.")
    rollouts = await env.run(ScriptedClient(policy), pa.RunSpec(rollouts_per_example=2))
    for r in rollouts:
        assert r.stop_reason == "answered"
        assert r.completion == [{"role": "assistant", "content": "4"}]
        assert len(r.turns) == 1
        assert r.answer == "4"
        assert r.error is None
    assert len(calls) == 2
    assert calls[0] == [{"role": "system", "content": "Be brief."}, user("2+2?")]
