"""Between palaestra and a verifiers environment: the model client, sampling, responses and saved state.

- ``ChatClient`` is what a verifiers environment finds in ``state["client"]``: an ``AsyncOpenAI``-like
  object (``client.chat.completions.create(model=, messages=, tools=, **sampling_args)``) over the
  palaestra ``ModelClient`` the engine gave the rollout (already limited to the run's concurrency).
  It returns real ``openai`` ``ChatCompletion`` objects built from palaestra's ``ModelResponse``.
- ``RolloutRun`` records each model turn on the palaestra ``Rollout`` (``turns`` with token ids,
  logprobs and usage; ``usage``; ``timing``), so eval, data and training see what they see for
  any palaestra environment.
- ``snapshot`` is the part of a verifiers ``state`` saved with the rollout: its own keys, without
  what the rollout record already holds (prompt, completion, answer, info), the trajectory, the
  client objects and the input row, so that saved rows stay small and JSON.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pydantic
from openai.types.chat import ChatCompletion

from palaestra.clients.base import ModelClient
from palaestra.openai_api import completion_body, tool_call
from palaestra.types import ModelResponse, Rollout, Sampling, State, Turn, Usage, content_text, derive_seed

STATE_KEY = "verifiers_state"  # the verifiers state, in the palaestra state's (unsaved) resources
UNSAVED = frozenset(
    (
        "input",
        "prompt",
        "completion",
        "answer",
        "info",
        "trajectory",
        "responses",
        "client",
        "model",
        "sampling_args",
        "oai_tools",
        "final_env_response",
        "reward",
        "metrics",
    )
)
_CLIENT_ONLY = frozenset(
    ("n", "timeout", "extra_headers", "extra_query", "stream", "model", "messages", "tools")
)
_FINISH = ("stop", "length", "tool_calls", "content_filter", "function_call")


def sampling_args(sampling: Sampling) -> dict[str, Any]:
    """``sampling`` as verifiers' ``sampling_args`` dict (OpenAI request keys), seed left out."""
    args: dict[str, Any] = {
        key: getattr(sampling, key)
        for key in ("temperature", "top_p", "max_tokens", "stop")
        if getattr(sampling, key) is not None
    }
    if sampling.logprobs:
        args["logprobs"] = True
    args["extra_body"] = dict(sampling.extra)
    return args


def to_sampling(args: dict[str, Any] | None, base: Sampling | None = None) -> Sampling:
    """verifiers' ``sampling_args`` over ``base``: known keys mapped, others sent in the request body."""
    base = base or Sampling()
    changes: dict[str, Any] = {}
    extra = dict(base.extra)
    for key, value in (args or {}).items():
        if value is None or key in _CLIENT_ONLY:
            continue
        if key in ("max_tokens", "max_completion_tokens"):
            changes["max_tokens"] = value
        elif key in ("temperature", "top_p", "stop", "seed"):
            changes[key] = value
        elif key == "logprobs":
            changes["logprobs"] = bool(value)
        elif key == "extra_body":
            extra.update(value)
        else:
            extra[key] = value
    return base.replace(**changes, extra=extra)


def merge_sampling(env: Sampling, run: Sampling) -> Sampling:
    """The run's sampling with the environment's filling what the run leaves unset (verifiers merges so)."""
    values = {
        f.name: getattr(run, f.name) if getattr(run, f.name) is not None else getattr(env, f.name)
        for f in dataclasses.fields(Sampling)
        if f.name not in ("logprobs", "extra")
    }
    return Sampling(**values, logprobs=run.logprobs or env.logprobs, extra={**env.extra, **run.extra})


def chat_completion(response: ModelResponse, model: str) -> ChatCompletion:
    """palaestra's ``ModelResponse`` as an ``openai`` ``ChatCompletion`` (vLLM-style token ids when known)."""
    raw = response.message
    content = raw.get("content")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if content is None or isinstance(content, str) else content_text(content),
    }
    calls = [tool_call(i, c) for i, c in enumerate(raw.get("tool_calls") or []) if isinstance(c, dict)]
    if calls:
        message["tool_calls"] = calls
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": response.finish_reason}
    choice["logprobs"] = (
        None
        if response.logprobs is None
        else {"content": [_logprob(i, lp, response.token_ids) for i, lp in enumerate(response.logprobs)]}
    )
    if response.token_ids is not None:
        choice["token_ids"] = list(response.token_ids)
    data = completion_body(model, choice, response.usage)
    if response.prompt_token_ids is not None:
        data["prompt_token_ids"] = list(response.prompt_token_ids)
    if response.finish_reason in _FINISH:
        try:
            return ChatCompletion.model_validate(data)
        except pydantic.ValidationError:
            pass
    return ChatCompletion.construct(**data)  # a finish reason OpenAI does not list (or none): kept as is


def _logprob(i: int, logprob: float, token_ids: list[int] | None) -> dict[str, Any]:
    token = f"token_id:{token_ids[i]}" if token_ids is not None and i < len(token_ids) else ""
    return {"token": token, "logprob": logprob, "bytes": None, "top_logprobs": []}


class _Completions:
    def __init__(self, client: ChatClient) -> None:
        self._client = client

    async def create(
        self, *, messages: list[dict[str, Any]], model: str | None = None, **kwargs: Any
    ) -> ChatCompletion:
        """A chat completion through the palaestra client (``tools`` and sampling keys as OpenAI's)."""
        return await self._client.create(messages=messages, model=model, **kwargs)


class _Chat:
    def __init__(self, client: ChatClient) -> None:
        self.completions = _Completions(client)


class ChatClient:
    """``state["client"]``: an ``AsyncOpenAI``-like chat client over one rollout's palaestra client.

    Only ``chat.completions.create`` is provided. A request's seed, unless given, is derived from
    the rollout's seed and its number of model turns so far, as palaestra's own environments do.
    """

    def __init__(self, client: ModelClient, rollout: Rollout) -> None:
        self.palaestra_client = client
        self.model = getattr(client, "model", "")
        self.base_url = getattr(client, "base_url", None)
        self.chat = _Chat(self)
        self._rollout = rollout
        self._made: list[tuple[ChatCompletion, ModelResponse, float]] = []

    async def create(
        self, *, messages: list[dict[str, Any]], model: str | None = None, **kwargs: Any
    ) -> ChatCompletion:
        tools = kwargs.get("tools")
        sampling = to_sampling(kwargs)
        if "seed" not in kwargs:
            sampling = sampling.replace(seed=derive_seed(self._rollout.seed, len(self._rollout.turns)))
        start = time.perf_counter()
        response = await self.palaestra_client.chat(
            [dict(m) for m in messages],
            tools=tools if isinstance(tools, list) and tools else None,
            sampling=sampling,
        )
        completion = chat_completion(response, model or self.model)
        self._made = [*self._made[-7:], (completion, response, time.perf_counter() - start)]
        return completion

    def take(self, completion: Any) -> tuple[ModelResponse, float] | None:
        """The palaestra response (and seconds taken) behind ``completion``, if this client made it."""
        for i, (made, response, seconds) in enumerate(self._made):
            if made is completion:
                del self._made[i]
                return response, seconds
        return None


@dataclasses.dataclass
class RolloutRun:
    """One rollout as palaestra records it, alongside the verifiers state the environment works on."""

    rollout: Rollout
    pa_state: State
    client: ChatClient
    cleaned_up: bool = False

    def record_turn(self, prompt_messages: list[Any], response: Any, tools: list[Any] | None) -> None:
        """Add the model turn that produced ``response`` to the rollout's turns, usage and timing."""
        rollout = self.rollout
        rollout.tools = tools or None
        made = self.client.take(response)
        if made is not None:
            reply, seconds = made
            usage, finish = reply.usage, reply.finish_reason
            ids, logprobs, prompt_ids = reply.token_ids, reply.logprobs, reply.prompt_token_ids
        else:  # a get_model_response override that did not call the client: what the object tells
            seconds, ids, logprobs, prompt_ids = 0.0, None, None, None
            used = getattr(response, "usage", None)
            usage = Usage(getattr(used, "prompt_tokens", 0) or 0, getattr(used, "completion_tokens", 0) or 0)
            choices = getattr(response, "choices", None) or [None]
            finish = getattr(choices[0], "finish_reason", None)
        turn = Turn(
            index=len(rollout.turns),
            prompt_messages=len(prompt_messages),
            finish_reason=finish,
            usage=usage,
            token_ids=ids,
            logprobs=logprobs,
            prompt_token_ids=prompt_ids,
            model_time=seconds,
        )
        rollout.turns.append(turn)
        rollout.usage += usage
        rollout.timing.model += seconds
        self.pa_state.turn = len(rollout.turns)

    def record_env_time(self, seconds: float) -> None:
        """Time the environment took answering the last turn."""
        if self.rollout.turns:
            self.rollout.turns[-1].env_time += seconds
        self.rollout.timing.env += seconds


def snapshot(state: dict[str, Any]) -> dict[str, Any]:
    """What of a verifiers state is saved with the rollout (see the module docstring)."""
    out = {key: value for key, value in dict.items(state) if key not in UNSAVED}
    if "task" not in out and state.get("task") is not None:
        out["task"] = state.get("task")
    error = out.get("error")
    if isinstance(error, BaseException):
        out["error"] = f"{type(error).__name__}: {error}"
    return out
