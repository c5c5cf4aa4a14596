"""Progress of an evaluation: a Rich bar on a terminal, plain lines otherwise.

Both show rollouts done/total, the running mean reward, the error count and completion tokens/s.
Plain lines come at most every 5 s as rollouts finish, and at least every ``HEARTBEAT`` seconds
even when none does (a slow model on a busy machine must not look like a hung one).

Tokens/s is live where the client counts tokens as it goes (``token_counter``): a ``LocalClient``
counts every token as it is generated, an ``OpenAIClient`` every reply as it arrives; the bar
refreshes it every second, so a long first reply does not read "0 tok/s" until its rollout ends.
Other clients' tokens are counted as their rollouts finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from palaestra.types import Rollout

HEARTBEAT = 30.0
REFRESH = 1.0  # seconds between the bar's refreshes of a live token count


def token_counter(client: Any) -> Callable[[], int] | None:
    """A function returning the completion tokens ``client`` has produced so far, where it counts them."""
    stats: Any = getattr(client, "stats", None)
    if isinstance(getattr(stats, "tokens", None), int):  # LocalClient: every generated token
        return lambda: int(stats.tokens)
    if isinstance(getattr(client, "completion_tokens", None), int):  # OpenAIClient: every reply
        return lambda: int(client.completion_tokens)
    return None


class EvalProgress:
    """Call ``update`` with each finished rollout; use as a context manager."""

    def __init__(
        self,
        total: int,
        *,
        done: int = 0,
        plain: bool | None = None,
        file: TextIO | None = None,
        live_tokens: Callable[[], int] | None = None,
    ) -> None:
        self.total = total
        self.done = done
        self.errors = 0
        self.reward_sum = 0.0
        self.rewarded = 0
        self.tokens = 0
        self.live_tokens = live_tokens
        self._tokens_before = live_tokens() if live_tokens is not None else 0  # a reused client's count
        self.file = file or sys.stderr
        self.plain = plain if plain is not None else not self.file.isatty()
        self._start = time.monotonic()
        self._last_line = 0.0
        self._printed = done
        self._heartbeat: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> EvalProgress:
        if self.plain:
            with contextlib.suppress(RuntimeError):  # outside an event loop: no heartbeat
                self._heartbeat = asyncio.get_running_loop().create_task(self._beat())
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
            if self.live_tokens is not None:
                with contextlib.suppress(RuntimeError):
                    self._ticker = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc_info: object) -> None:
        for task in (self._heartbeat, self._ticker):
            if task is not None:
                task.cancel()
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
        elif self._printed != self.done:  # the last count has not been printed yet
            self._line()

    def stats(self) -> str:
        mean = f"{self.reward_sum / self.rewarded:.3f}" if self.rewarded else "-"
        elapsed = max(time.monotonic() - self._start, 1e-9)
        return f"reward {mean}  errors {self.errors}  {self.generated() / elapsed:,.0f} tok/s"

    def generated(self) -> int:
        """Completion tokens produced in this run so far: live where the client counts them."""
        if self.live_tokens is not None:
            return self.live_tokens() - self._tokens_before
        return self.tokens

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(REFRESH)
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, stats=self.stats())

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

    async def _beat(self) -> None:
        while True:
            quiet_for = time.monotonic() - max(self._last_line, self._start)
            if quiet_for >= HEARTBEAT:
                self._line()
            else:
                await asyncio.sleep(HEARTBEAT - quiet_for)

    def _line(self) -> None:
        self._last_line = time.monotonic()
        self._printed = self.done
        elapsed = time.monotonic() - self._start
        print(f"eval {self.done}/{self.total}  {self.stats()}  {elapsed:,.0f} s", file=self.file, flush=True)
