"""A sampler that fails mid-run: one line, and the run stops before it trains on a partial batch.

A rollout whose model request failed is skipped, as every failed rollout is, when the sampler is
still there (one bad request). When the sampler itself is gone (its server exited or stops
answering, the engine gave up after many failures in a row, new weights were refused, every Ray
rollout worker died with no replacement left), the step's batch is partial: the run stops with
the reason and what it keeps to resume from. A batch whose every rollout failed stops the run
too (``check_not_all_failed``): it has nothing to learn from, and the next would fail alike.

Under torchrun the ranks sample their shares apart, and one may find the server gone while the
others are still waiting for their requests: ``every_rank`` has them agree before any goes on, so
every rank stops at the same step and rank 0 says why; the others end after rank 0 (a rank that
ended first would have torchrun stop rank 0 before it could say it, or stop the server it runs).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from palaestra.clients.base import ModelUnavailable
from palaestra.eval.ray_executor import ExecutorError
from palaestra.train.common import TrainingError, kept
from palaestra.train.distributed import World
from palaestra.train.samplers.sync import SyncError
from palaestra.types import Rollout

STOPPED = "the run stopped, with no step trained on a partial batch"


class SamplerGone(TrainingError):
    """The sampler can sample no more at ``step``, for ``reason``: the run stops there."""

    def __init__(self, step: int, reason: str, last_saved: Path | None) -> None:
        self.step, self.reason = step, reason
        super().__init__(f"step {step}: {reason}; {STOPPED}; {kept(last_saved)}")


@contextlib.asynccontextmanager
async def sampler_failures(step: int, sampler: Any, last_saved: Path | None) -> AsyncIterator[None]:
    """A sampler that went away (its server died or stopped answering) or refused new weights, in
    the block: one line, and the run stops before it trains on a partial batch."""
    try:
        yield
    except (ModelUnavailable, SyncError, ExecutorError) as exc:
        reason = await sampler.failure() or str(exc)
        raise SamplerGone(step, reason, last_saved) from None


async def check_batch(rollouts: list[Rollout], step: int, sampler: Any, last_saved: Path | None) -> None:
    """Rollouts whose model request failed are skipped, as every failed rollout is; but when the
    sampler itself is gone the batch is partial: the run stops there."""
    if any(r.error is not None and r.error.stage == "model" for r in rollouts):
        reason = await sampler.failure()
        if reason is not None:
            raise SamplerGone(step, reason, last_saved)


@contextlib.asynccontextmanager
async def every_rank(world: World, step: int, sampler: Any, last_saved: Path | None) -> AsyncIterator[None]:
    """The block on every rank, then the ranks agree: if the sampler was gone for any of them,
    every rank stops with ``SamplerGone`` (rank 0's reason first; rank 0 asks its sampler, which
    knows the exit of a server it started). One process: the block alone."""
    reason = None
    try:
        yield
    except SamplerGone as exc:
        if world.size == 1:
            raise
        reason = exc.reason
    reasons = [r for r in world.gather([reason]) if r is not None]
    if reasons:
        after_rank_0(world)
        mine = await sampler.failure() if world.main else None
        raise SamplerGone(step, mine or reasons[0], last_saved)


def after_rank_0(world: World) -> None:
    """On the other ranks, before they stop with an error rank 0 stops with too: wait until rank 0
    has ended, having said why (a barrier rank 0 never joins returns when its process is gone, or
    torchrun stops this one). A rank that ended first would have torchrun stop rank 0 before it
    printed its line, and before it stopped the server it runs."""
    if not world.main:
        with contextlib.suppress(TrainingError):
            world.barrier()


def check_not_all_failed(rollouts: list[Rollout], step: int, world: World, last_saved: Path | None) -> None:
    """A batch whose every rollout failed (a prompt past the model's positions, a reward function
    that raises on every reply) has nothing to learn from, and the next would fail alike: one
    line, and the run stops. ``rollouts`` is the whole batch, the same on every rank."""
    if not rollouts or any(r.error is None for r in rollouts):
        return
    first = rollouts[0].error
    assert first is not None
    after_rank_0(world)
    raise TrainingError(
        f"step {step}: every one of the batch's {len(rollouts)} rollouts failed (the first at its "
        f"{first.stage}: {first.message}); the run stopped before training on it; {kept(last_saved)}"
    )
