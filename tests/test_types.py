"""Tests for palaestra.types: the Rollout record's JSON round trip, seeds and sampling arguments."""

from __future__ import annotations

import datetime
import json
import random
import threading
from collections.abc import Iterator

import pytest

from palaestra.types import (
    ErrorInfo,
    Example,
    ModelResponse,
    Rollout,
    Sampling,
    State,
    Timing,
    Turn,
    Usage,
    derive_seed,
)


def full_rollout() -> Rollout:
    """A rollout with every field set to something other than its default."""
    return Rollout(
        example_id=3,
        rollout_index=1,
        seed=derive_seed(0, 3, 1),
        prompt=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        completion=[
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "sure?"},
            {"role": "assistant", "content": "yes, 4"},
        ],
        answer="4",
        info={"level": 2, "tags": ["math"]},
        turns=[
            Turn(
                index=0,
                prompt_messages=2,
                finish_reason="stop",
                usage=Usage(prompt_tokens=7, completion_tokens=1),
                token_ids=[19],
                logprobs=[-0.25],
                model_time=0.5,
                env_time=0.125,
            ),
            Turn(
                index=1,
                prompt_messages=4,
                finish_reason="length",
                usage=Usage(prompt_tokens=9, completion_tokens=2),
                token_ids=[88, 19],
                logprobs=[-1.5, -0.0625],
                model_time=0.75,
            ),
        ],
        state={"moves": [1, 2], "won": True, "score": 0.5, "note": None},
        reward=1.5,
        metrics={"correct": 1.0, "format": 0.5},
        stop_reason="max_turns",
        error=ErrorInfo(type="RewardError", message="in format: boom", stage="scoring"),
        timing=Timing(model=1.25, env=0.125, scoring=0.01, total=1.5),
        usage=Usage(prompt_tokens=16, completion_tokens=3),
    )


# --- Rollout serialisation ----------------------------------------------------------------------


def test_rollout_round_trips_through_json() -> None:
    rollout = full_rollout()
    data = json.loads(json.dumps(rollout.to_dict()))
    restored = Rollout.from_dict(data)
    assert restored == rollout
    assert isinstance(restored.turns[1], Turn) and isinstance(restored.turns[1].usage, Usage)
    assert restored.turns[1].token_ids == [88, 19] and restored.turns[1].logprobs == [-1.5, -0.0625]
    assert restored.error == ErrorInfo("RewardError", "in format: boom", "scoring")
    assert restored.timing == Timing(model=1.25, env=0.125, scoring=0.01, total=1.5)
    assert restored.usage == Usage(16, 3)


def test_rollout_round_trip_without_error_or_turns() -> None:
    rollout = Rollout(example_id=0, rollout_index=0, seed=1, prompt=[{"role": "user", "content": "hi"}])
    restored = Rollout.from_dict(json.loads(json.dumps(rollout.to_dict())))
    assert restored == rollout
    assert restored.error is None and restored.reward is None and restored.turns == []


def test_to_dict_stores_state_values_json_cannot_hold_as_repr() -> None:
    class Board:
        def __repr__(self) -> str:
            return "Board(3x3)"

    example = Example(id=0, prompt=[{"role": "user", "content": "play"}])
    state = State(example, random.Random(1))
    state.update({"board": Board(), "seen": {2}, "pair": (1, "a"), "by_move": {5: "x"}, "n": 3})
    rollout = Rollout(example_id=0, rollout_index=0, seed=1, prompt=example.prompt, state=state)

    data = rollout.to_dict()

    json.dumps(data)  # must not raise
    assert data["state"] == {
        "board": "Board(3x3)",
        "seen": "{2}",
        "pair": [1, "a"],
        "by_move": {"5": "x"},
        "n": 3,
    }
    # the live rollout keeps its state object, attributes and values untouched
    assert rollout.state is state and isinstance(rollout.state["board"], Board)
    assert state.rng is not None and state.example is example


def test_to_dict_makes_info_and_answer_json_ready() -> None:
    rollout = Rollout(
        example_id=0,
        rollout_index=0,
        seed=1,
        prompt=[],
        answer={1, 2},
        info={"when": datetime.date(2024, 1, 2)},
    )
    data = rollout.to_dict()
    json.dumps(data)
    assert data["answer"] == "{1, 2}"
    assert data["info"] == {"when": "datetime.date(2024, 1, 2)"}


def test_to_dict_stores_uncopyable_info_and_answer_as_repr() -> None:
    def moves() -> Iterator[int]:
        yield 1

    rollout = Rollout(
        example_id=0, rollout_index=0, seed=1, prompt=[], answer=moves(), info={"lock": threading.Lock()}
    )
    data = rollout.to_dict()  # eval saves every rollout: this must not raise
    json.dumps(data)
    assert data["answer"].startswith("<generator object")
    assert data["info"]["lock"].startswith("<unlocked _thread.lock object")


def test_rollout_messages_is_prompt_then_completion() -> None:
    rollout = full_rollout()
    assert rollout.messages == rollout.prompt + rollout.completion


# --- seeds ----------------------------------------------------------------------------------------


def test_derive_seed_is_stable_across_versions() -> None:
    # Saved runs are reproduced from these values: they must never change.
    assert derive_seed(0, 0, 0) == 6436203349130839549
    assert derive_seed(1234, 5, 2) == 6241206701190965352
    assert derive_seed("tictactoe", 7) == 5576546568481867915


def test_derive_seed_differs_for_different_inputs() -> None:
    seeds = {
        derive_seed(run, example, index) for run in range(4) for example in range(8) for index in range(8)
    }
    assert len(seeds) == 4 * 8 * 8
    assert derive_seed(1, 2) != derive_seed(2, 1)  # order matters
    assert derive_seed(1, 23) != derive_seed(12, 3)  # parts are separated
    assert derive_seed(0) != derive_seed(0, 0)


def test_derive_seed_fits_in_63_bits() -> None:
    for parts in [(0,), (2**62, 2**62), ("x" * 1000,), (-1, -2)]:
        assert 0 <= derive_seed(*parts) < 2**63


# --- Sampling, Usage, ErrorInfo, ModelResponse -----------------------------------------------------


def test_sampling_replace_returns_a_changed_copy() -> None:
    base = Sampling(temperature=0.7, max_tokens=64, stop=["\n"], extra={"top_k": 20})
    changed = base.replace(seed=42)
    assert changed.seed == 42
    assert (changed.temperature, changed.max_tokens, changed.stop, changed.extra) == (
        0.7,
        64,
        ["\n"],
        {"top_k": 20},
    )
    assert base.seed is None  # the original is untouched
    assert changed is not base


def test_sampling_replace_rejects_unknown_fields() -> None:
    with pytest.raises(TypeError):
        Sampling().replace(temprature=1.0)


def test_usage_adds_in_place() -> None:
    total = Usage(1, 2)
    total += Usage(10, 20)
    assert total == Usage(prompt_tokens=11, completion_tokens=22)


def test_error_info_from_exception_keeps_type_and_message() -> None:
    assert ErrorInfo.from_exception(KeyError("k"), "env") == ErrorInfo("KeyError", "'k'", "env")
    assert ErrorInfo.from_exception(ValueError("bad value"), "model") == ErrorInfo(
        "ValueError", "bad value", "model"
    )
    empty = ErrorInfo.from_exception(RuntimeError(), "scoring")
    assert empty.type == "RuntimeError" and empty.message  # never an empty message


def test_model_response_content_of_a_tool_call_message_is_empty_text() -> None:
    response = ModelResponse(message={"role": "assistant", "content": None, "tool_calls": []})
    assert response.content == ""
    assert ModelResponse(message={"role": "assistant", "content": "hi"}).content == "hi"
