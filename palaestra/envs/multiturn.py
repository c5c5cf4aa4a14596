"""MultiTurnEnv: the model and the environment take turns until a stop condition holds.

A subclass implements ``env_response(messages, state)`` and, if it needs per-episode data,
``setup_state(state)``. Stop conditions are methods decorated with ``@stop``; they are checked
before every model turn and right after it, highest ``priority`` first, and the first that holds
names the rollout's ``stop_reason``. Unless one holds, ``env_response`` answers every model
reply — the one that reaches ``max_turns`` too, so the environment can act on it — and the
episode then ends with stop reason ``max_turns``. ``env_response`` may also end the episode
itself by returning ``Final(messages)``: those messages are appended and no model turn follows.

``cleanup_state(state)`` runs when the episode ends, however it ends: a stop, an error, the
rollout's timeout or the run being cancelled. Release there what ``setup_state`` acquired.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from palaestra.binding import Binder
from palaestra.clients.base import ModelClient
from palaestra.envs.base import Environment
from palaestra.types import ErrorInfo, Messages, Rollout, Sampling, State, Turn, derive_seed

F = TypeVar("F", bound=Callable[..., Any])
STOP_ARGS = ("messages", "state", "prompt", "completion")


def stop(func: F | None = None, *, priority: int = 0) -> Any:
    """Mark a method ``(self, state)`` or ``(self, messages, state)`` returning bool as a stop condition.

    Use as ``@stop`` or ``@stop(priority=10)``; higher priorities are checked first.
    """

    def mark(f: F) -> F:
        f.__palaestra_stop__ = priority  # type: ignore[attr-defined]  # a marker read by MultiTurnEnv
        return f

    return mark(func) if func is not None else mark


class EpisodeError(Exception):
    """Raised by a hook to end the rollout with exactly this ``ErrorInfo`` recorded."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


@dataclass
class Final:
    """Returned by ``env_response`` to end the episode after appending ``messages``."""

    messages: Messages
    reason: str = "env_final"


# verifiers' names for what palaestra does otherwise: a subclass defining one would be silently ignored
FOREIGN_HOOKS = {
    "is_completed": "mark stop conditions with @pa.stop",
    "get_model_response": "the engine calls the client; override episode() to change a turn",
}


def _check_hooks(cls: type) -> None:
    """Mistakes that would fail every rollout, found when the environment is built."""
    if cls.env_response is MultiTurnEnv.env_response:  # type: ignore[attr-defined]  # cls is a subclass
        raise TypeError(f"{cls.__name__} must implement env_response(self, messages, state)")
    for hook in ("setup_state", "env_response", "cleanup_state"):
        if not inspect.iscoroutinefunction(getattr(cls, hook)):
            raise TypeError(f"{cls.__name__}.{hook} must be an async method (async def {hook}(...))")
    for name, instead in FOREIGN_HOOKS.items():
        if hasattr(cls, name):
            warnings.warn(f"{cls.__name__}.{name} is never called by palaestra: {instead}", stacklevel=4)


class MultiTurnEnv(Environment):
    """Alternate model and environment turns, up to ``max_turns`` model replies.

    Other keyword arguments (``timeout`` among them) are ``Environment``'s.
    """

    def __init__(self, *, max_turns: int = 10, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.max_turns = max_turns
        _check_hooks(type(self))
        found = []
        for name, member in inspect.getmembers(type(self), callable):
            if hasattr(member, "__palaestra_stop__"):
                method = getattr(self, name)
                found.append(
                    (-member.__palaestra_stop__, name, Binder(method, STOP_ARGS, what="stop condition"))
                )
        self._stops = [(name, binder) for _, name, binder in sorted(found, key=lambda t: t[:2])]

    async def setup_state(self, state: State) -> None:
        """Fill ``state`` before the first turn (``state.example`` and ``state.rng`` are set)."""

    async def env_response(self, messages: Messages, state: State) -> Messages | Final:
        """The environment's reply to the model's last message."""
        raise NotImplementedError(f"{type(self).__name__} must implement env_response")

    async def cleanup_state(self, state: State) -> None:
        """Release what ``setup_state`` acquired; called once per episode however it ended (also
        when ``setup_state`` failed half-way, so check what is there)."""

    async def episode(self, client: ModelClient, rollout: Rollout, state: State, sampling: Sampling) -> None:
        try:
            await self._episode(client, rollout, state, sampling)
        finally:
            # shielded: a second cancellation while cleaning up lets the caller go, not the resources
            await asyncio.shield(self._env_step(rollout, "cleanup_state", self.cleanup_state(state)))

    async def _episode(self, client: ModelClient, rollout: Rollout, state: State, sampling: Sampling) -> None:
        messages = rollout.prompt + rollout.completion
        ok, _ = await self._env_step(rollout, "setup_state", self.setup_state(state))
        if not ok:
            return
        while True:
            if await self._stopped(rollout, messages, state) or self._at_turn_cap(rollout, state):
                return
            request = sampling.replace(seed=derive_seed(rollout.seed, state.turn))
            rollout.tools = self.tools  # what the model was given: SFT renders the same prompt
            t0 = time.perf_counter()
            try:  # a copy: a client that keeps the list must not see later turns appear in it
                response = await client.chat(list(messages), tools=self.tools, sampling=request)
            except Exception as exc:  # noqa: BLE001 - any model failure is recorded, never raised
                rollout.error = ErrorInfo.from_exception(exc, stage="model")
                rollout.stop_reason = "error"
                return
            model_time = time.perf_counter() - t0
            messages.append(response.message)
            rollout.completion.append(response.message)
            turn = Turn(
                index=state.turn,
                prompt_messages=len(messages) - 1,
                finish_reason=response.finish_reason,
                usage=response.usage,
                token_ids=response.token_ids,
                logprobs=response.logprobs,
                prompt_token_ids=response.prompt_token_ids,
                model_time=model_time,
            )
            rollout.turns.append(turn)
            rollout.usage += response.usage
            rollout.timing.model += model_time
            state.turn += 1
            if await self._stopped(rollout, messages, state):
                return
            # the environment answers every reply, the last one before max_turns too, so that
            # it can act on it (a game's final move is played and scored); the cap applies next
            t0 = time.perf_counter()
            ok, out = await self._env_step(rollout, "env_response", self.env_response(messages, state))
            turn.env_time = time.perf_counter() - t0
            rollout.timing.env += turn.env_time
            if not ok:
                return
            new = out.messages if isinstance(out, Final) else out
            if not isinstance(new, list):
                rollout.error = ErrorInfo(
                    "TypeError", f"env_response returned {type(new).__name__}, not a list", "env"
                )
                rollout.stop_reason = "error"
                return
            messages.extend(new)
            rollout.completion.extend(new)
            if isinstance(out, Final):
                rollout.stop_reason = out.reason
                return

    async def _env_step(self, rollout: Rollout, what: str, step: Any) -> tuple[bool, Any]:
        """Await an environment hook: (True, result), or (False, None) with the error recorded."""
        try:
            return True, await step
        except Exception as exc:  # noqa: BLE001 - env bugs are recorded as the rollout's error
            if rollout.error is None:  # the first error is the cause; a cleanup failure after it is not
                info = exc.info if isinstance(exc, EpisodeError) else None
                rollout.error = info or ErrorInfo(type(exc).__name__, f"in {what}: {exc}", stage="env")
                rollout.stop_reason = "error"
            return False, None

    async def _stopped(self, rollout: Rollout, messages: Messages, state: State) -> bool:
        values = {
            "messages": messages,
            "state": state,
            "prompt": rollout.prompt,
            "completion": rollout.completion,
        }
        for name, binder in self._stops:
            try:
                done = await binder.call(values)
            except Exception as exc:  # noqa: BLE001 - recorded like any env error
                rollout.error = ErrorInfo(type(exc).__name__, f"in stop condition {name}: {exc}", stage="env")
                rollout.stop_reason = "error"
                return True
            if done:
                rollout.stop_reason = name
                return True
        return False

    def _at_turn_cap(self, rollout: Rollout, state: State) -> bool:
        if state.turn >= self.max_turns:
            rollout.stop_reason = "max_turns"
            return True
        return False
