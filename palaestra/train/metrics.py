"""What a training run reports: one JSON line per step in ``metrics.jsonl``, and progress on screen.

``MetricsLog`` is what both trainers write through: ``metrics.jsonl``, and the trackers the
config's ``output.tracking`` names (TensorBoard, W&B: ``palaestra.train.tracking``).

The progress is a Rich bar on a terminal and a plain line every ``log_every`` steps otherwise
(logs, CI, pipes), both on stderr.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from palaestra.train.config import to_dict
from palaestra.train.tracking import Tracker, numeric, open_trackers

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """Appends one JSON object per step to ``metrics.jsonl``; resuming drops the steps after the checkpoint.

    Given the run's ``config``, every record also goes to the trackers its ``output.tracking``
    names; use the log as a context manager so that they are closed however the run ends."""

    def __init__(self, run_dir: Path, *, after_step: int = 0, config: Any = None) -> None:
        self.path = run_dir / METRICS_FILE
        self._trackers: list[Tracker] = []
        if self.path.exists():  # a resumed run repeats the steps after its checkpoint: keep one copy
            kept = [line for line in read_metrics(self.path) if _step_of(line) <= after_step]
            # replaced whole, through a temporary file: a kill leaves the old log or the new one
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(json.dumps(line) + "\n" for line in kept))
            tmp.replace(self.path)
        output = getattr(config, "output", None)
        if output is not None and output.tracking:
            self._trackers = open_trackers(
                output.tracking,
                run_dir,
                config=to_dict(config),
                wandb_project=output.wandb_project,
                wandb_mode=output.wandb_mode,
                after_step=after_step,
            )

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps({k: _finite(v) for k, v in record.items()}) + "\n")
        if self._trackers:
            step, values = int(record.get("step", 0)), numeric(record)
            for tracker in self._trackers:
                tracker.log(step, values)

    def close(self) -> None:
        """Close the trackers (``metrics.jsonl`` is closed after every write)."""
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (lines that do not parse, as from a killed write, are skipped)."""
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


class TrainProgress:
    """Call ``update`` after every step; use as a context manager."""

    label = "sft"

    def __init__(
        self,
        total: int,
        *,
        done: int = 0,
        log_every: int = 1,
        plain: bool | None = None,
        quiet: bool = False,
        file: TextIO | None = None,
    ) -> None:
        self.total = total
        self.done = done
        self.log_every = log_every
        self.file = file or sys.stderr
        self.plain = plain if plain is not None else not self.file.isatty()
        self.quiet = quiet
        self._bar: Progress | None = None
        self._task: Any = None
        self._start = time.monotonic()

    def __enter__(self) -> TrainProgress:
        if not (self.plain or self.quiet):
            self._bar = Progress(
                TextColumn(f"[bold]{self.label}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                console=Console(file=self.file),
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.done, stats="")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def stats(self, record: dict[str, Any]) -> str:
        """The step's figures on one line."""
        return (
            f"loss {record['loss']:.4f}  lr {record['lr']:.2e}  grad {record['grad_norm']:.3g}  "
            f"{record['tokens_per_s']:,.0f} tok/s ({record['trained_tokens_per_s']:,.0f} trained)"
        )

    def update(self, record: dict[str, Any]) -> None:
        self.done = record["step"]
        stats = self.stats(record)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, stats=stats)
        elif self.quiet:
            return
        elif self.done % self.log_every == 0 or self.done == self.total:
            elapsed = time.monotonic() - self._start
            print(f"step {self.done}/{self.total}  {stats}  {elapsed:.0f}s", file=self.file, flush=True)

    def note(self, text: str) -> None:
        """A line between the updates (a checkpoint saved, say)."""
        if self._bar is not None:
            self._bar.console.print(text, soft_wrap=True)
        elif not self.quiet:
            print(text, file=self.file, flush=True)


def _step_of(record: dict[str, Any]) -> float:
    """A record's step; a damaged one (not a number) counts as after every checkpoint, so it is dropped."""
    step = record.get("step", 0)
    return step if isinstance(step, (int, float)) and not isinstance(step, bool) else math.inf


def _finite(value: Any) -> Any:
    """NaN and infinity as strings, so every line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
