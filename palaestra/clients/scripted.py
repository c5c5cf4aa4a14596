"""ScriptedClient: a plain Python function that plays the model, for tests, teachers and opponents."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from palaestra.binding import Binder
from palaestra.types import Messages, ModelResponse, Sampling, Usage

POLICY_ARGS = ("messages", "rng", "tools", "sampling")


class ScriptedClient:
    """Answers each chat with ``policy(...)``, arguments bound by name from ``messages``, ``rng``,
    ``tools`` and ``sampling``.

    ``rng`` is a ``random.Random`` seeded from the request's ``sampling.seed``, which the engine
    derives from (run seed, example, rollout, turn): a policy that samples from it is reproducible
    whatever the concurrency. The policy returns the reply text, an assistant message dict, or a
    ``ModelResponse``; it may be ``async``. Token usage is counted in whitespace-separated words.
    """

    def __init__(self, policy: Callable[..., Any], *, model: str = "scripted") -> None:
        self.model = model
        self._policy = Binder(policy, POLICY_ARGS, what="scripted policy")

    async def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> ModelResponse:
        rng = random.Random(sampling.seed)
        out = await self._policy.call(
            {"messages": messages, "rng": rng, "tools": tools, "sampling": sampling}
        )
        if isinstance(out, ModelResponse):
            return out
        if isinstance(out, str):
            message: dict[str, Any] = {"role": "assistant", "content": out}
        elif isinstance(out, dict):
            message = {"role": "assistant", **out}
        else:
            raise TypeError(
                f"scripted policy returned {type(out).__name__}; expected str, dict or ModelResponse"
            )
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        usage = Usage(
            prompt_tokens=sum(len(str(m.get("content") or "").split()) for m in messages),
            completion_tokens=len(str(message.get("content") or "").split()),
        )
        return ModelResponse(message=message, finish_reason=finish, usage=usage)
