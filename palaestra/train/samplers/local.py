"""The in-process sampler: a ``LocalClient`` over the trained module itself; no weights are copied."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any


class LocalSampler:
    """The trained module itself, sampled in this process by a ``LocalClient`` (on its device, in its
    dtype: CUDA when the trainer is on CUDA). The sampler sees each update the moment it is made, so
    ``sync`` only records the version; it pauses generation while the weights change."""

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int) -> None:
        from palaestra.clients.local import LocalClient

        self.model = model
        self.client = LocalClient.from_model(model, tokenizer, name="policy", max_batch_size=max_batch_size)
        self.version = 0

    async def start(self, version: int) -> None:
        """The client samples the trained module from the start: nothing to serve."""
        self.version = version

    @contextlib.asynccontextmanager
    async def updating(self) -> AsyncIterator[None]:
        async with self.client.paused():  # no generation runs while the weights change
            self.model.train()
            try:
                yield
            finally:
                self.model.eval()

    async def sync(self, version: int) -> None:
        """Nothing to copy: the client samples the trained module."""
        self.version = version

    async def failure(self) -> str | None:
        """An in-process sampler cannot go away."""
        return None

    async def aclose(self) -> None:
        await self.client.aclose()
