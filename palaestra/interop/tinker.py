"""A palaestra environment as Tinker cookbook-style RL environments (pure Python, no service).

The cookbook's interface is an ``Env`` with ``async initial_observation() -> (observation,
stop_condition)`` and ``async step(action_tokens) -> StepResult``, made in groups by an
``EnvGroupBuilder`` (``make_envs``, ``compute_group_rewards``) that an ``RLDataset`` hands out in
batches (``get_batch``, ``__len__``). Here:

- ``PalaestraEnv`` is one episode of one example. Observations are token prompts built by a
  cookbook renderer (anything with ``build_generation_prompt(messages)``, ``get_stop_sequences()``
  and ``parse_response(tokens) -> (message, ok)``); an action's tokens are parsed back into the
  assistant message the environment answers, and kept on the rollout's turn.
- ``PalaestraGroupBuilder`` makes the ``rollouts_per_example`` episodes of one example and scores
  them together with the environment's rubric (group reward functions see the whole group), so
  each trajectory's reward is the reward ``palaestra eval`` gives the same replies.
- ``PalaestraDataset`` walks the examples in order, ``group_size`` episodes each.

The cookbook's classes are not imported: these match their methods and fields, so a recipe can
use them where it takes its own (or wrap them in its base classes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from palaestra.envs.base import Environment
from palaestra.interop.episodes import Episode, score
from palaestra.types import Example, ModelResponse, Rollout, Sampling, content_text

ERROR_METRIC = "palaestra_error"  # 1 for a rollout that failed: its reward is then 0


class Renderer(Protocol):
    """What the adapter needs of a cookbook renderer."""

    def build_generation_prompt(self, messages: list[dict[str, Any]]) -> Any: ...

    def get_stop_sequences(self) -> list[Any]: ...

    def parse_response(self, response: list[int]) -> tuple[dict[str, Any], Any]: ...


@dataclass
class StepResult:
    """The cookbook's ``StepResult``: the step's reward, whether the episode ended, what comes next."""

    reward: float
    episode_done: bool
    next_observation: Any
    next_stop_condition: Any
    metrics: dict[str, float] = field(default_factory=dict)


class PalaestraEnv:
    """One episode of ``example`` in ``env``; discard it after the episode, as the cookbook does.

    With ``score=True`` (alone, outside a group builder) the last step's reward is the
    rollout's reward, scored as a group of one; a group builder scores its episodes together
    instead and the steps' rewards are 0.
    """

    def __init__(
        self,
        env: Environment,
        example: Example,
        renderer: Renderer,
        *,
        seed: int = 0,
        rollout_index: int = 0,
        sampling: Sampling | None = None,
        score: bool = True,
        idle_timeout: float = 3600.0,
    ) -> None:
        self.renderer = renderer
        self.episode = Episode(
            id=f"{example.id}/{rollout_index}",
            env=env,
            example=example,
            seed=seed,
            rollout_index=rollout_index,
            sampling=sampling or env.sampling,
            auto_score=score,
            idle_timeout=idle_timeout,
        )

    @property
    def rollout(self) -> Rollout | None:
        """The palaestra rollout once the episode ended."""
        return self.episode.rollout

    @property
    def sampling(self) -> Sampling | None:
        """The sampling the environment asks for on this turn (its seed is palaestra's per-turn seed)."""
        pending = self.episode.pending
        return pending.sampling if pending is not None and self.episode.waiting() else None

    async def initial_observation(self) -> tuple[Any, Any]:
        self.episode.start()
        await self.episode.settle()
        return self._observation(), self.renderer.get_stop_sequences()

    async def step(self, action: list[int]) -> StepResult:
        message, _ = self.renderer.parse_response(action)
        reply = {"role": "assistant", "content": content_text(message.get("content"))}
        if message.get("tool_calls"):
            reply["tool_calls"] = message["tool_calls"]
        finish = "tool_calls" if reply.get("tool_calls") else "stop"
        self.episode.act(ModelResponse(reply, finish_reason=finish, token_ids=list(action)), None)
        await self.episode.settle()
        if not self.episode.done:
            return StepResult(0.0, False, self._observation(), self.renderer.get_stop_sequences())
        reward, metrics = rewarded(self.rollout) if self.episode.auto_score else (0.0, {})
        return StepResult(reward, True, self._observation(), self.renderer.get_stop_sequences(), metrics)

    def _observation(self) -> Any:
        rollout = self.rollout
        if rollout is not None:
            return self.renderer.build_generation_prompt(rollout.prompt + rollout.completion)
        if self.episode.done:  # cancelled
            return self.renderer.build_generation_prompt(self.episode.last_prompt)
        assert self.episode.pending is not None  # settled: it waits for a reply
        return self.renderer.build_generation_prompt(self.episode.pending.messages)

    async def aclose(self) -> None:
        """End the episode early (the environment's cleanup runs); a no-op once it ended."""
        if hasattr(self.episode, "task"):
            await self.episode.cancel()


def rewarded(rollout: Rollout | None) -> tuple[float, dict[str, float]]:
    """A scored rollout's (reward, metrics) as the cookbook takes them: a failure is 0, flagged."""
    if rollout is None or rollout.reward is None or not math.isfinite(rollout.reward):
        return 0.0, {ERROR_METRIC: 1.0}
    return float(rollout.reward), {**rollout.metrics, ERROR_METRIC: 0.0}


class PalaestraGroupBuilder:
    """The ``group_size`` episodes of one example, scored together by the environment's rubric."""

    def __init__(
        self,
        env: Environment,
        example: Example,
        renderer: Renderer,
        *,
        group_size: int,
        seed: int = 0,
        sampling: Sampling | None = None,
    ) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        self.env, self.example, self.renderer = env, example, renderer
        self.group_size, self.seed, self.sampling = group_size, seed, sampling
        self.envs: list[PalaestraEnv] = []

    async def make_envs(self) -> Sequence[PalaestraEnv]:
        self.envs = [
            PalaestraEnv(
                self.env,
                self.example,
                self.renderer,
                seed=self.seed,
                rollout_index=i,
                sampling=self.sampling,
                score=False,
            )
            for i in range(self.group_size)
        ]
        return self.envs

    async def compute_group_rewards(
        self, trajectory_group: Sequence[Any]
    ) -> list[tuple[float, dict[str, float]]]:
        """Each trajectory's reward and metrics (in ``make_envs`` order), the group scored at once."""
        if len(trajectory_group) != len(self.envs):
            raise ValueError(f"{len(trajectory_group)} trajectories for a group of {len(self.envs)} episodes")
        rollouts = [e.rollout for e in self.envs]
        finished = [r for r in rollouts if r is not None]
        await score(self.env, finished, self.example)
        return [rewarded(r) for r in rollouts]

    def logging_tags(self) -> list[str]:
        return [self.example.env or type(self.env).__name__]


class PalaestraDataset:
    """The environment's examples in order, ``batch_size`` groups of ``group_size`` episodes a batch."""

    def __init__(
        self,
        env: Environment,
        renderer: Renderer,
        *,
        batch_size: int,
        group_size: int,
        seed: int = 0,
        num_examples: int = -1,
        sampling: Sampling | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.env, self.renderer = env, renderer
        self.examples = env.select(num_examples)
        self.batch_size, self.group_size, self.seed, self.sampling = batch_size, group_size, seed, sampling

    def __len__(self) -> int:
        return math.ceil(len(self.examples) / self.batch_size)

    def get_batch(self, index: int) -> list[PalaestraGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        chunk = self.examples[index * self.batch_size : (index + 1) * self.batch_size]
        return [
            PalaestraGroupBuilder(
                self.env, e, self.renderer, group_size=self.group_size, seed=self.seed, sampling=self.sampling
            )
            for e in chunk
        ]
