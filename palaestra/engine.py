"""The engine: many rollouts at once on one event loop, scored group by group, streamed out.

- ``RunSpec.max_concurrent`` bounds model requests in flight, not groups or rollouts: the engine
  hands environments a ``LimitedClient``, so a rollout busy in its environment turn holds no slot
  and a custom ``episode`` needs no limiter of its own.
- A group is the ``rollouts_per_example`` rollouts of one example; it is scored together (group
  reward functions need all of it) and yielded as soon as it is scored.
- Groups start in example order, a bounded number at a time (enough to keep every request slot
  busy), so finished groups come out steadily from the start of a run and memory stays flat.
- Every rollout ends with a result or a recorded error; if the consumer stops early, or the run is
  cancelled (Ctrl-C), every pending rollout is cancelled before the generator returns.
- When ``RunSpec.max_failures_in_a_row`` model requests in a row fail, the server is taken to be
  gone: the groups already done are yielded, the rest are cancelled, and ``ModelUnavailable``
  is raised (a resume runs them later).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from palaestra.clients.base import ModelClient, ModelUnavailable
from palaestra.clients.limited import LimitedClient
from palaestra.clients.routed import sticky_group
from palaestra.types import Example, Rollout, RunSpec, Sampling

if TYPE_CHECKING:
    from palaestra.envs.base import Environment


class GroupExecutor(Protocol):
    """Where a run's groups are rolled out: this process (``stream_groups``) by default, or workers
    (``palaestra.eval.ray_executor.RayExecutor``); either yields each scored group as it finishes."""

    def stream_groups(
        self, env: Environment, client: ModelClient, examples: Sequence[Example], spec: RunSpec
    ) -> AsyncGenerator[list[Rollout], None]: ...


async def run_group(
    env: Environment, client: ModelClient, example: Example, *, count: int, seed: int, sampling: Sampling
) -> list[Rollout]:
    """The ``count`` scored rollouts of one example; their requests share one endpoint when the
    client has several (``RoutedClient``)."""
    with sticky_group():  # the rollouts' tasks, started in the block, inherit the group's route
        runs = [
            env.rollout(client, example, rollout_index=i, seed=seed, sampling=sampling) for i in range(count)
        ]
        # one rollout needs no extra task: awaiting it directly saves a task per example
        rollouts = [await runs[0]] if len(runs) == 1 else list(await asyncio.gather(*runs))
    await env.rubric.score_group(rollouts, [example] * len(rollouts))
    return rollouts


def groups_in_flight(spec: RunSpec) -> int:
    """How many groups run at once: twice what fills every request slot (rollouts also spend time
    in their environment turns, holding no slot)."""
    return 2 * math.ceil(spec.max_concurrent / spec.rollouts_per_example)


async def stream_groups(
    env: Environment, client: ModelClient, examples: Sequence[Example], spec: RunSpec
) -> AsyncGenerator[list[Rollout], None]:
    """Yield each example's scored group of rollouts, in the order groups finish."""
    done: asyncio.Queue[asyncio.Task[list[Rollout]] | Exception] = asyncio.Queue()
    limited = LimitedClient(
        client,
        asyncio.Semaphore(spec.max_concurrent),
        max_failures_in_a_row=spec.max_failures_in_a_row,
        on_give_up=done.put_nowait,  # the last error, queued behind the groups already done
    )
    sampling = spec.sampling or env.sampling
    running: set[asyncio.Task[list[Rollout]]] = set()
    todo: Iterator[Example] = iter(examples)

    def start_next() -> None:
        example = next(todo, None)
        if example is not None:
            group = run_group(
                env, limited, example, count=spec.rollouts_per_example, seed=spec.seed, sampling=sampling
            )
            task = asyncio.create_task(group)
            task.add_done_callback(done.put_nowait)
            running.add(task)

    for _ in range(min(groups_in_flight(spec), len(examples))):
        start_next()
    try:
        for _ in range(len(examples)):
            finished = await done.get()
            if isinstance(finished, Exception):
                n = spec.max_failures_in_a_row
                raise ModelUnavailable(
                    f"stopped: {n} model requests in a row failed; the last with "
                    f"{type(finished).__name__}: {finished}"
                ) from finished
            running.discard(finished)
            start_next()
            yield finished.result()
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def stream_rollouts(
    env: Environment, client: ModelClient, examples: Sequence[Example], spec: RunSpec
) -> AsyncGenerator[Rollout, None]:
    """Yield scored rollouts group by group, in the order groups finish."""
    groups = stream_groups(env, client, examples, spec)
    async with contextlib.aclosing(groups):
        async for group in groups:
            for rollout in group:
                yield rollout
