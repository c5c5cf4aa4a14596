"""Run a coroutine on the fastest event loop installed: uvloop where present, else asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, on uvloop (a dependency except on Windows) when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def being_cancelled() -> bool:
    """Whether the current task is being cancelled (a timeout, the run), rather than user code
    having raised ``CancelledError`` itself: only the first must go through an error handler."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def captured(awaitable: Awaitable[T]) -> T | BaseException:
    """``awaitable``'s result, or whatever it raised (``SystemExit`` too) as a value.

    ``asyncio.gather(..., return_exceptions=True)`` runs each coroutine as a task, and a task lets
    ``SystemExit`` and ``KeyboardInterrupt`` out to the event loop, ending the run; awaited
    through this, user code's exceptions stay data. The task's own cancellation goes through.
    """
    try:
        return await awaitable
    except asyncio.CancelledError:
        if being_cancelled():
            raise
        return asyncio.CancelledError("raised by user code")
    except BaseException as exc:  # noqa: BLE001 - user code's failure is a value here, whatever it is
        return exc
