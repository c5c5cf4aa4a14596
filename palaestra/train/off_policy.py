"""Asynchronous steps with bounded staleness: each step's rollouts, sampled ahead of the trainer.

With ``train.max_off_policy_steps = k``, while the trainer updates on step n's batch the sampler
already samples the batches of steps n+1..n+k with the weights it has. A batch is tagged with the
policy version that sampled it (how many updates its weights had); the trainer is at version n
when it trains step n, so the batch is n − version steps off-policy, and that never exceeds k: a
batch starts only while its step − the sampler's version ≤ k, and its version is fixed when it starts.

The sampler does one thing at a time, a batch, a weight push or a held-out evaluation (``_lock``),
so weights never change under a batch. New weights are pushed only when no batch is running, and
in the foreground: the trainer waits for the push, so the weights do not change while they are
written. With k = 0 every batch starts after the weights of the step before were pushed: the
on-policy loop, call for call.

Under torchrun every rank keeps its own ``Batches`` and calls it at the same points of the loop,
and the remote sampler's pushes are collectives, so every rank must push at the same points too.
Whether the sampler is idle is a matter of timing, so ``agree`` gives every rank rank 0's answer
(a broadcast at each point a push may happen); rank 0 samples every group (the others' batches are
empty and the ranks' exchange gives them the rollouts), so its answer is the one that counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from palaestra.types import Rollout


@dataclass
class Batch:
    """One step's rollouts, the policy version that sampled them and the sampling's wall time."""

    rollouts: list[Rollout]
    version: int
    seconds: float


class Batches:
    """The batches of the coming steps, sampled by ``sampler`` at most ``ahead`` versions behind."""

    def __init__(
        self,
        sampler: Any,
        sample: Callable[[int], Awaitable[list[Rollout]]],
        *,
        ahead: int,
        steps: int,
        version: int,
        agree: Callable[[bool], Awaitable[bool]] | None = None,
    ) -> None:
        self.sampler, self._sample, self.ahead, self.steps = sampler, sample, ahead, steps
        self._agree = agree  # several ranks: rank 0's view of whether the sampler is idle
        self.served = version  # the version the sampler samples with
        self.trained = version  # the newest version the trainer has
        self.sync_seconds = 0.0  # time spent pushing weights, summed (the trainer reads and resets it)
        self._tasks: dict[int, asyncio.Task[Batch]] = {}
        self._lock = asyncio.Lock()  # FIFO: batches, pushes and evaluations take turns in order

    async def take(self, step: int) -> tuple[Batch, float]:
        """Step ``step``'s batch (sampled now, with the newest weights, if it was not sampled ahead),
        and how long the trainer waited for it."""
        t0 = time.perf_counter()
        if step not in self._tasks:
            await self._push_if_idle()
            self._tasks[step] = asyncio.create_task(self._run(step))
        task = self._tasks[step]
        try:
            batch = await task
        finally:
            if task.done():
                del self._tasks[step]
        return batch, time.perf_counter() - t0

    async def sample_ahead(self, step: int) -> None:
        """While step ``step`` trains: push the trainer's newest weights if the sampler is idle, then
        start every batch of steps step+1..step+k that the staleness bound allows."""
        if not self.ahead:
            return
        await self._push_if_idle()
        for later in range(step + 1, min(step + 1 + self.ahead, self.steps)):
            if later in self._tasks:
                continue
            if later - self.served > self.ahead:
                break
            self._tasks[later] = asyncio.create_task(self._run(later))

    def trained_to(self, version: int) -> None:
        """The trainer now has the weights of ``version``; they reach the sampler at the next push."""
        self.trained = version

    @contextlib.asynccontextmanager
    async def newest(self) -> AsyncIterator[None]:
        """The sampler alone, with the trainer's newest weights, for the block (a held-out evaluation)."""
        async with self._lock:
            await self._push()
            yield

    async def aclose(self) -> None:
        """Cancel the batches sampled ahead that no step will take."""
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()

    async def _run(self, step: int) -> Batch:
        async with self._lock:
            version, t0 = self.served, time.perf_counter()
            rollouts = await self._sample(step)
            for rollout in rollouts:
                rollout.policy_version = version
            return Batch(rollouts, version, time.perf_counter() - t0)

    async def _push_if_idle(self) -> None:
        if self.trained <= self.served:  # the same on every rank: nothing to agree on
            return
        idle = all(task.done() for task in self._tasks.values())
        if self._agree is not None:
            idle = await self._agree(idle)
        if idle:
            async with self._lock:
                await self._push()

    async def _push(self) -> None:
        if self.trained > self.served:
            t0 = time.perf_counter()
            await self.sampler.sync(self.trained)
            self.served = self.trained
            self.sync_seconds += time.perf_counter() - t0
