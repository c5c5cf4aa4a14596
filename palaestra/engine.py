"""The engine: many rollouts at once on one event loop, scored group by group, streamed out.

- ``max_concurrent`` bounds model requests in flight (a semaphore around each ``chat`` call),
  not groups or rollouts: a rollout busy in its environment turn holds no slot.
- A group is the ``rollouts_per_example`` rollouts of one example; it is scored together (group
  reward functions need all of it) and its rollouts are yielded as soon as it is scored.
- Every rollout ends with a result or a recorded error; if the consumer stops early, or the run is
  cancelled (Ctrl-C), every pending rollout is cancelled before the generator returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from palaestra.clients.base import ModelClient
from palaestra.types import Example, Rollout, Sampling

if TYPE_CHECKING:
    from palaestra.envs.base import Environment


async def run_group(
    env: Environment,
    client: ModelClient,
    example: Example,
    *,
    rollouts_per_example: int,
    seed: int,
    sampling: Sampling,
    limiter: asyncio.Semaphore | None = None,
) -> list[Rollout]:
    """The scored rollouts of one example."""
    runs = [
        env.rollout(client, example, rollout_index=i, seed=seed, sampling=sampling, limiter=limiter)
        for i in range(rollouts_per_example)
    ]
    # one rollout needs no extra task: awaiting it directly saves a task per example
    rollouts = [await runs[0]] if len(runs) == 1 else await asyncio.gather(*runs)
    await env.rubric.score_group(rollouts, [example] * len(rollouts))
    return rollouts


async def stream_groups(
    env: Environment,
    client: ModelClient,
    examples: Sequence[Example],
    *,
    rollouts_per_example: int = 1,
    max_concurrent: int = 32,
    seed: int = 0,
    sampling: Sampling,
) -> AsyncIterator[list[Rollout]]:
    """Yield each example's scored group of rollouts, in the order groups finish."""
    if rollouts_per_example < 1:
        raise ValueError(f"rollouts_per_example must be at least 1, got {rollouts_per_example}")
    if max_concurrent < 1:
        raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
    limiter = asyncio.Semaphore(max_concurrent)
    done: asyncio.Queue[asyncio.Task[list[Rollout]]] = asyncio.Queue()
    tasks = []
    for example in examples:
        task = asyncio.create_task(
            run_group(
                env,
                client,
                example,
                rollouts_per_example=rollouts_per_example,
                seed=seed,
                sampling=sampling,
                limiter=limiter,
            )
        )
        task.add_done_callback(done.put_nowait)
        tasks.append(task)
    try:
        for _ in range(len(tasks)):
            finished = await done.get()
            yield finished.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_rollouts(
    env: Environment,
    client: ModelClient,
    examples: Sequence[Example],
    *,
    rollouts_per_example: int = 1,
    max_concurrent: int = 32,
    seed: int = 0,
    sampling: Sampling,
) -> AsyncIterator[Rollout]:
    """Yield scored rollouts group by group, in the order groups finish."""
    groups = stream_groups(
        env,
        client,
        examples,
        rollouts_per_example=rollouts_per_example,
        max_concurrent=max_concurrent,
        seed=seed,
        sampling=sampling,
    )
    async with contextlib.aclosing(groups):
        async for group in groups:
            for rollout in group:
                yield rollout
