"""SingleTurnEnv: one prompt, one model reply, scored."""

from __future__ import annotations

from typing import Any

from palaestra.envs.multiturn import MultiTurnEnv, stop
from palaestra.types import Messages, State


class SingleTurnEnv(MultiTurnEnv):
    """A prompt and a single model reply; the rollout's ``stop_reason`` is ``answered``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_turns=1, **kwargs)

    @stop
    def answered(self, state: State) -> bool:
        return state.turn >= 1

    async def env_response(self, messages: Messages, state: State) -> Messages:  # pragma: no cover
        raise AssertionError("a single-turn environment never responds")
