"""The environment's side of the RL trainer: its environments loaded from the config, each step's
examples, and their rollouts through the engine ``palaestra eval`` runs (one rollout path for both)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from palaestra.clients.base import ModelClient
from palaestra.engine import GroupExecutor, stream_groups
from palaestra.envs.base import Environment
from palaestra.registry import load_environment
from palaestra.train.config import ConfigError
from palaestra.types import Example, Rollout, RunSpec


async def collect(
    env: Environment,
    client: ModelClient,
    examples: list[Example],
    spec: RunSpec,
    executor: GroupExecutor | None = None,
) -> list[Rollout]:
    """Every scored rollout of ``examples``: the engine's stream, as ``palaestra eval`` runs it (on
    ``executor``'s workers when given)."""
    rollouts: list[Rollout] = []
    stream = executor.stream_groups if executor is not None else stream_groups
    async with contextlib.aclosing(stream(env, client, examples, spec)) as groups:
        async for group in groups:
            rollouts.extend(group)
    return sorted(rollouts, key=lambda r: (r.example_id, r.rollout_index))


def step_examples(examples: Sequence[Example], step: int, count: int) -> list[Example]:
    """The ``count`` consecutive examples of ``step``, wrapping around the dataset."""
    n = len(examples)
    return [examples[(step * count + i) % n] for i in range(count)]


def load_env(env_id: str, args: dict[str, Any], where: str) -> Environment:
    """The environment ``env_id`` with ``args``; one it cannot load is a ``ConfigError`` naming ``where``."""
    from palaestra.registry import EnvironmentArgsError, EnvironmentNotFound

    try:
        return load_environment(env_id, **args)
    except (EnvironmentNotFound, EnvironmentArgsError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def check_template(tokenizer: Any, env: Environment) -> None:
    """The model's chat template must render the environment's messages (found here, not mid-run)."""
    from palaestra.chat_template import prompt_ids

    prompt, tools = env.examples[0].prompt, env.tool_schemas()
    try:
        prompt_ids(tokenizer, prompt, tools=tools)
    except Exception as exc:  # noqa: BLE001 - jinja errors of any kind: one clear line
        roles = ", ".join(str(m.get("role")) for m in prompt)
        raise ConfigError(
            f"the model's chat template cannot render the environment's first prompt ({roles}"
            f"{', with tools' if tools else ''}): {exc}"
        ) from None
