"""What the RL trainer needs of a sampler (``LocalSampler``, ``RemoteSampler``)."""

from __future__ import annotations

import contextlib
from typing import Protocol

from palaestra.clients.base import ModelClient


class Sampler(Protocol):
    """Where rollouts are sampled: ``client`` answers the engine with the weights of the policy
    version last synced; the trained weights change inside ``updating()`` and reach the client
    through ``sync(version)``. ``LocalSampler`` samples the trained module in this process,
    ``RemoteSampler`` a server (vLLM, ``palaestra serve``) that gets each version's weights."""

    @property
    def client(self) -> ModelClient: ...

    async def start(self, version: int) -> None: ...

    def updating(self) -> contextlib.AbstractAsyncContextManager[None]: ...

    async def sync(self, version: int) -> None: ...

    async def failure(self) -> str | None: ...

    async def aclose(self) -> None: ...
