"""A run's request slots: the client the engine hands to environments, and the rollout deadline.

The engine wraps the model client in a ``LimitedClient`` so that at most ``max_concurrent``
requests are in flight across all rollouts. An environment's rollout only ever talks to that
client: it needs no limiter of its own, and time spent waiting for a free slot is taken off the
rollout's timeout (``Environment.timeout``), because queueing is the run's business, not the
rollout's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from palaestra.clients.base import ModelClient
from palaestra.types import Messages, ModelResponse, Sampling

_deadline: ContextVar[asyncio.Timeout | None] = ContextVar("palaestra_rollout_deadline", default=None)


@contextlib.contextmanager
def rollout_deadline(deadline: asyncio.Timeout) -> Iterator[None]:
    """Within the block, a ``LimitedClient`` waiting for a slot pauses ``deadline``."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


class LimitedClient:
    """``client`` with its requests limited by ``slots``; other attributes are the client's own."""

    def __init__(self, client: ModelClient, slots: asyncio.Semaphore) -> None:
        self.inner = client
        self.model = client.model
        self._slots = slots

    async def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> ModelResponse:
        await self._acquire()
        try:
            return await self.inner.chat(messages, tools=tools, sampling=sampling)
        finally:
            self._slots.release()

    async def _acquire(self) -> None:
        deadline = _deadline.get()
        when = deadline.when() if deadline is not None else None
        if deadline is None or when is None or not self._slots.locked():
            await self._slots.acquire()  # no deadline to pause, or a free slot: no wait
            return
        loop = asyncio.get_running_loop()
        waited_from = loop.time()
        deadline.reschedule(None)  # queueing for a slot is not this rollout's time
        try:
            await self._slots.acquire()
        finally:
            deadline.reschedule(when + loop.time() - waited_from)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
