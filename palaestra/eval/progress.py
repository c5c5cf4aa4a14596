"""Progress of an evaluation: a Rich bar on a terminal, plain lines otherwise.

Both show rollouts done/total, the running mean reward, the error count and completion tokens/s.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from palaestra.types import Rollout


class EvalProgress:
    """Call ``update`` with each finished rollout; use as a context manager."""

    def __init__(
        self, total: int, *, done: int = 0, plain: bool | None = None, file: TextIO | None = None
    ) -> None:
        self.total = total
        self.done = done
        self.errors = 0
        self.reward_sum = 0.0
        self.rewarded = 0
        self.tokens = 0
        self.file = file or sys.stderr
        self.plain = plain if plain is not None else not self.file.isatty()
        self._start = time.monotonic()
        self._last_line = 0.0
        self._printed = done
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> EvalProgress:
        if not self.plain:
            self._bar = Progress(
                TextColumn("[bold]eval"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                console=Console(file=self.file),
                transient=False,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("eval", total=self.total, completed=self.done, stats=self.stats())
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
        elif self._printed != self.done:  # the last count has not been printed yet
            self._line()

    def stats(self) -> str:
        mean = f"{self.reward_sum / self.rewarded:.3f}" if self.rewarded else "-"
        elapsed = max(time.monotonic() - self._start, 1e-9)
        return f"reward {mean}  errors {self.errors}  {self.tokens / elapsed:,.0f} tok/s"

    def update(self, rollout: Rollout) -> None:
        self.done += 1
        self.errors += rollout.error is not None
        if rollout.reward is not None:
            self.reward_sum += rollout.reward
            self.rewarded += 1
        self.tokens += rollout.usage.completion_tokens
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self.done, stats=self.stats())
        elif time.monotonic() - self._last_line >= 5 or self.done == self.total:
            self._line()

    def _line(self) -> None:
        self._last_line = time.monotonic()
        self._printed = self.done
        print(f"eval {self.done}/{self.total}  {self.stats()}", file=self.file, flush=True)
