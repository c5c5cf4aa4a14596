"""The environment server's wire format: request checks and response bodies (docs/interop.md).

It follows OpenEnv's HTTP contract where one fits: ``POST /reset`` and ``POST /step`` answer
``{"observation", "reward", "done", "metadata"}``, ``GET /state`` the episode's state with
``episode_id`` and ``step_count``. palaestra's additions are fields inside those (the chat
messages, tool schemas, sampling, metrics, the full rollout), never other shapes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from palaestra.interop.episodes import Episode, EpisodeProblem
from palaestra.rollout_json import jsonable
from palaestra.types import SEED_RANGE, Example, ModelResponse, Sampling, Usage, derive_seed

MAX_ID_LENGTH = 255


def bad(message: str, code: str = "invalid_request") -> EpisodeProblem:
    return EpisodeProblem(400, code, message)


def _int(body: dict[str, Any], key: str, default: int, low: int = 0, high: int = SEED_RANGE) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        raise bad(f"'{key}' must be an integer in [{low}, {high}), not {value!r:.50}")
    return value


def _object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad(f"{what} must be a JSON object, not {type(body).__name__}")
    return body


def _known(body: dict[str, Any], keys: set[str], what: str) -> None:
    unknown = sorted(set(body) - keys)
    if unknown:
        raise bad(f"{what} has unknown fields: {', '.join(repr(k)[:50] for k in unknown)}")


def episode_id(body: dict[str, Any], *, required: bool = True) -> str | None:
    value = body.get("episode_id")
    if value is None and not required:
        return None
    if value is None:
        raise bad("'episode_id' is missing: this server runs many episodes; send the id /reset answered")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH:
        raise bad(f"'episode_id' must be a string of 1 to {MAX_ID_LENGTH} characters, not {value!r:.50}")
    return value


@dataclass(frozen=True)
class ResetRequest:
    example_id: int
    seed: int
    rollout_index: int
    episode_id: str | None
    sampling: Sampling | None
    score: bool


RESET_KEYS = {"seed", "example_id", "rollout_index", "episode_id", "sampling", "score"}


def parse_reset(body: Any, num_examples: int) -> ResetRequest:
    """Check a ``/reset`` body; the example defaults to ``seed % num_examples`` (as ``palaestra play``)."""
    body = _object({} if body is None else body, "the request body")
    _known(body, RESET_KEYS, "the request body")
    seed = _int(body, "seed", 0)
    if "example_id" in body and body["example_id"] is not None:
        example_id = _int(body, "example_id", 0, high=2**63)
        if example_id >= num_examples:
            raise EpisodeProblem(
                404,
                "unknown_example",
                f"no example {example_id}: the environment has {num_examples} (0 to {num_examples - 1})",
            )
    else:
        example_id = seed % num_examples
    sampling = body.get("sampling")
    if sampling is not None:
        try:
            sampling = Sampling.from_dict(_object(sampling, "'sampling'"))
        except (TypeError, ValueError) as exc:
            raise bad(f"'sampling': {exc}") from None
    score = body.get("score", True)
    if not isinstance(score, bool):
        raise bad(f"'score' must be true or false, not {score!r:.50}")
    return ResetRequest(
        example_id=example_id,
        seed=seed,
        rollout_index=_int(body, "rollout_index", 0, high=2**31),
        episode_id=episode_id(body, required=False),
        sampling=sampling,
        score=score,
    )


@dataclass(frozen=True)
class StepRequest:
    episode_id: str
    response: ModelResponse
    turn: int | None


STEP_KEYS = {"episode_id", "action", "turn", "timeout_s", "request_id"}
ACTION_KEYS = {
    "message",
    "content",
    "tool_calls",
    "finish_reason",
    "token_ids",
    "logprobs",
    "prompt_token_ids",
    "usage",
}


def parse_step(body: Any) -> StepRequest:
    """Check a ``/step`` body: the episode, and the assistant's reply as the ``action``."""
    body = _object(body, "the request body")
    _known(body, STEP_KEYS, "the request body")
    episode = episode_id(body)
    assert episode is not None  # required
    turn = None if body.get("turn") is None else _int(body, "turn", 0, high=2**31)
    action = _object(body.get("action"), "'action'")
    _known(action, ACTION_KEYS, "'action'")
    if "message" in action:
        if "content" in action or "tool_calls" in action:
            raise bad("'action' gives either a 'message' or its 'content'/'tool_calls', not both")
        message = _assistant(_object(action["message"], "'action.message'"))
    else:
        message = _assistant({k: action[k] for k in ("content", "tool_calls") if k in action})
    finish = action.get("finish_reason") or ("tool_calls" if message.get("tool_calls") else "stop")
    if not isinstance(finish, str):
        raise bad("'action.finish_reason' must be a string")
    usage = _object(action.get("usage") or {}, "'action.usage'")
    _known(usage, {"prompt_tokens", "completion_tokens"}, "'action.usage'")
    response = ModelResponse(
        message=message,
        finish_reason=finish,
        usage=Usage(
            _int(usage, "prompt_tokens", 0, high=2**31), _int(usage, "completion_tokens", 0, high=2**31)
        ),
        token_ids=_ids(action, "token_ids"),
        logprobs=_numbers(action, "logprobs"),
        prompt_token_ids=_ids(action, "prompt_token_ids"),
    )
    return StepRequest(episode_id=episode, response=response, turn=turn)


def _assistant(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role", "assistant")
    if role != "assistant":
        raise bad(f"the action is the model's reply: its role must be 'assistant', not {role!r:.50}")
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
            raise bad("'content' parts must be {'type': 'text', 'text': ...}")
    elif content is not None and not isinstance(content, str):
        raise bad("'content' must be a string or a list of text parts")
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise bad("'tool_calls' must be a list")
        for i, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not (
                isinstance(function, dict)
                and isinstance(function.get("name"), str)
                and isinstance(function.get("arguments", ""), str)
            ):
                raise bad(f"tool_calls[{i}] must be {{'function': {{'name': str, 'arguments': str}}}}")
    if content is None and not calls:
        raise bad("the reply needs 'content' or 'tool_calls'")
    return {**message, "role": "assistant", "content": content}


def _ids(action: dict[str, Any], key: str) -> list[int] | None:
    value = action.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise bad(f"'action.{key}' must be a list of integers")
    return value


def _numbers(action: dict[str, Any], key: str) -> list[float] | None:
    value = action.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
    ):
        raise bad(f"'action.{key}' must be a list of finite numbers")
    return [float(v) for v in value]


def parse_ids(body: Any) -> list[str]:
    """The ``episode_ids`` of a ``/score`` body."""
    body = _object(body, "the request body")
    _known(body, {"episode_ids"}, "the request body")
    ids = body.get("episode_ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise bad("'episode_ids' must be a list of episode ids")
    return ids


# --- responses ----------------------------------------------------------------------------


def sampling_dict(sampling: Sampling) -> dict[str, Any]:
    return dataclasses.asdict(sampling)


def example_dict(example: Example) -> dict[str, Any]:
    return {
        "id": example.id,
        "prompt": example.prompt,
        "answer": jsonable(example.answer),
        "info": jsonable(example.info),
    }


def observation(episode: Episode, answered: int) -> dict[str, Any]:
    """The reply to ``/reset`` (``answered`` -1) or ``/step``: what the model must answer now, or the end.

    ``messages`` is the whole conversation (the model's input when not done); ``new_messages`` what
    the environment added since the reply it answered (``answered`` messages preceded that reply).
    """
    rollout = episode.rollout
    if episode.done:
        messages = rollout.prompt + rollout.completion if rollout is not None else episode.last_prompt
        tools, sampling = episode.env.tool_schemas(), None
    else:
        assert episode.pending is not None  # settled: it waits for a reply
        messages, tools = episode.pending.messages, episode.pending.tools
        sampling = sampling_dict(episode.pending.sampling)
    new = messages if answered < 0 else messages[answered + 1 :]
    obs: dict[str, Any] = {
        "messages": messages,
        "new_messages": new,
        "tools": tools,
        "sampling": sampling,
        "turn": episode.turn,
    }
    return {
        "observation": obs,
        "reward": rollout.reward if rollout is not None and episode.scored else None,
        "done": episode.done,
        "metadata": result_metadata(episode),
    }


def result_metadata(episode: Episode) -> dict[str, Any]:
    """What palaestra knows about the episode beyond OpenEnv's fields."""
    rollout = episode.rollout
    meta: dict[str, Any] = {
        "episode_id": episode.id,
        "example_id": episode.example.id,
        "rollout_index": episode.rollout_index,
        "seed": episode.seed,
        "rollout_seed": derive_seed(episode.seed, episode.example.id, episode.rollout_index),
    }
    if episode.done:
        meta.update(
            stop_reason=rollout.stop_reason if rollout is not None else "cancelled",
            error=dataclasses.asdict(rollout.error) if rollout is not None and rollout.error else None,
            metrics=dict(rollout.metrics) if rollout is not None and episode.scored else {},
            scored=episode.scored,
        )
    return meta


def state(episode: Episode) -> dict[str, Any]:
    """``GET /state``: OpenEnv's ``episode_id`` and ``step_count``, then the episode's result and rollout."""
    rollout = episode.rollout
    return {
        "episode_id": episode.id,
        "step_count": episode.turn,
        "done": episode.done,
        "waiting": episode.waiting(),
        "reward": rollout.reward if rollout is not None and episode.scored else None,
        **result_metadata(episode),
        "rollout": rollout.to_dict() if rollout is not None else None,
    }
