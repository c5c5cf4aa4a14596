"""A sampler that fails mid-run: one line, and the run stops before it trains on a partial batch.

A rollout whose model request failed is skipped, as every failed rollout is, when the sampler is
still there (one bad request). When the sampler itself is gone (its server exited or stops
answering, the engine gave up after many failures in a row, new weights were refused), the step's
batch is partial: the run stops with the reason and what it keeps to resume from.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from palaestra.clients.base import ModelUnavailable
from palaestra.train.common import TrainingError, kept
from palaestra.train.samplers.sync import SyncError
from palaestra.types import Rollout

STOPPED = "the run stopped, with no step trained on a partial batch"


@contextlib.asynccontextmanager
async def sampler_failures(step: int, sampler: Any, last_saved: Path | None) -> AsyncIterator[None]:
    """A sampler that went away (its server died or stopped answering) or refused new weights, in
    the block: one line, and the run stops before it trains on a partial batch."""
    try:
        yield
    except (ModelUnavailable, SyncError) as exc:
        reason = await sampler.failure() or str(exc)
        raise TrainingError(f"step {step}: {reason}; {STOPPED}; {kept(last_saved)}") from None


async def check_batch(rollouts: list[Rollout], step: int, sampler: Any, last_saved: Path | None) -> None:
    """Rollouts whose model request failed are skipped, as every failed rollout is; but when the
    sampler itself is gone the batch is partial: the run stops there."""
    if any(r.error is not None and r.error.stage == "model" for r in rollouts):
        reason = await sampler.failure()
        if reason is not None:
            raise TrainingError(f"step {step}: {reason}; {STOPPED}; {kept(last_saved)}")
