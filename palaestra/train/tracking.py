"""Experiment tracking: a step's figures sent to TensorBoard or Weights & Biases as well as ``metrics.jsonl``.

One small interface, ``Tracker`` (``log(step, values)`` and ``close()``), with one class per tool.
Which ones a run uses is ``output.tracking`` in the trainer's config (``["tensorboard"]``,
``["wandb"]``, both, or ``[]``, the default); ``MetricsLog`` writes every record through them.
Each tool is an extra (``palaestra[tensorboard]``, ``palaestra[wandb]``) checked when the config
is read, so a missing one is a one-line config error before anything is written.

- TensorBoard: event files in ``RUN_DIR/tensorboard`` (``tensorboard --logdir RUN_DIR``). A
  resumed run starts its writer at the checkpoint's step with ``purge_step``, so TensorBoard
  drops the steps the run repeats, as ``metrics.jsonl`` does.
- W&B: a run under ``RUN_DIR/wandb``, offline by default (no network, no account; ``wandb sync
  RUN_DIR/wandb/offline-run-*`` uploads it later), ``online`` when asked. The W&B run is named
  after the run folder and carries the config; a resumed run is a new W&B run in the same group.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

TRACKERS = ("tensorboard", "wandb")
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # tracker → the module it needs


class Tracker(Protocol):
    """Where a run's figures go besides ``metrics.jsonl``."""

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Record ``values`` (finite or not) at ``step``."""

    def close(self) -> None:
        """Flush what is buffered and finish the tool's run."""


def missing_tracker_package(name: str) -> str | None:
    """The one-line reason tracker ``name`` cannot be used here, or None when its package is installed."""
    module = _PACKAGES[name]
    if importlib.util.find_spec(module) is None:
        return (
            f"output.tracking names {name}, which needs the {module} package: pip install 'palaestra[{name}]'"
        )
    return None


def numeric(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics record, less its step (booleans, text and None are not figures)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[key] = float(value)
    return out


class TensorBoardTracker:
    """Scalars in TensorBoard event files under ``RUN_DIR/tensorboard``, flushed every step."""

    def __init__(self, run_dir: Path, *, after_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events at or past it from an earlier process are dropped by TensorBoard's reader
        self._writer = SummaryWriter(
            log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=after_step + 1 if after_step else None
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    """A Weights & Biases run under ``RUN_DIR/wandb`` (offline unless ``mode="online"``)."""

    def __init__(
        self, run_dir: Path, *, config: Mapping[str, Any], project: str, mode: str, after_step: int = 0
    ) -> None:
        import wandb

        (run_dir / WANDB_DIR).mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")  # its banner would break the trainers' progress lines
        self._run = wandb.init(
            dir=str(run_dir),
            project=project,
            name=run_dir.name + (f"-from-{after_step}" if after_step else ""),
            group=run_dir.name,
            config=dict(config),
            mode="online" if mode == "online" else "offline",
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)  # W&B's step must only grow, as a run's does

    def close(self) -> None:
        self._run.finish()


def open_trackers(
    names: tuple[str, ...],
    run_dir: Path,
    *,
    config: Mapping[str, Any],
    wandb_project: str = "palaestra",
    wandb_mode: str = "offline",
    after_step: int = 0,
) -> list[Tracker]:
    """One tracker per name in ``names``, writing under ``run_dir``."""
    trackers: list[Tracker] = []
    for name in names:
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir, after_step=after_step))
        elif name == "wandb":
            trackers.append(
                WandbTracker(
                    run_dir, config=config, project=wandb_project, mode=wandb_mode, after_step=after_step
                )
            )
        else:
            raise ValueError(f"unknown tracker {name!r}: one of {', '.join(TRACKERS)}")
    return trackers
