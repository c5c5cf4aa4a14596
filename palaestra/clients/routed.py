"""Several endpoints serving one model (``-b URL1,URL2,...``): least-pending routing, group
stickiness, and draining an endpoint that dies.

- **Least pending**: a group's first request goes to the live endpoint with the fewest requests
  in flight from this process, so a slow or busy server gets less work.
- **Stickiness**: every later request of that group goes to the same endpoint: a group's
  rollouts share their prompt, and multi-turn rollouts their history, which a server's prefix
  cache then serves. The engine opens a ``sticky_group`` around each group (``run_group``); a
  request outside one is routed on its own.
- **Draining**: a request that fails for a reason worth retrying (the connection refused or
  dropped, a timeout, 429 or 5xx), after the endpoint client's own retries, drains that
  endpoint for ``drain_seconds``: no new group goes there, the request and its group move to the
  least pending of the others, and the request is retried there. After ``drain_seconds`` the
  endpoint is tried again. Only when every endpoint has failed the request does it fail.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from palaestra.clients.base import ModelConnectionError, TransientModelError
from palaestra.clients.openai import OpenAIClient
from palaestra.types import Messages, ModelResponse, Sampling


@dataclass
class GroupRoute:
    """The endpoint a group's requests go to (None until its first request)."""

    endpoint: int | None = None


_route: ContextVar[GroupRoute | None] = ContextVar("palaestra_group_route", default=None)


@contextlib.contextmanager
def sticky_group() -> Iterator[None]:
    """Within the block (one group's rollouts and the tasks they start), requests share an endpoint."""
    token = _route.set(GroupRoute())
    try:
        yield
    finally:
        _route.reset(token)


class RoutedClient:
    """One model behind several ``OpenAIClient`` endpoints, as one client (see the module docstring)."""

    def __init__(self, clients: Sequence[OpenAIClient], *, drain_seconds: float = 30.0) -> None:
        if not clients:
            raise ValueError("RoutedClient needs at least one endpoint")
        self.clients = list(clients)
        self.model = self.clients[0].model
        self.base_url = ",".join(c.base_url for c in self.clients)  # what a saved run records, and -b reads
        self.api_key_var = self.clients[0].api_key_var
        self.token_ids = self.clients[0].token_ids
        self.drain_seconds = drain_seconds
        self.pending = [0] * len(self.clients)  # requests in flight, per endpoint
        self.drained_until = [0.0] * len(self.clients)  # time.monotonic() before which none goes there
        self.drains = 0  # how many times an endpoint was drained

    @property
    def completion_tokens(self) -> int:
        """Completion tokens of every reply so far, all endpoints together (the progress bar's)."""
        return sum(c.completion_tokens for c in self.clients)

    async def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> ModelResponse:
        route = _route.get()
        failed: set[int] = set()
        while True:
            i = self._pick(route, failed)
            self.pending[i] += 1
            try:
                return await self.clients[i].chat(messages, tools=tools, sampling=sampling)
            except TransientModelError:
                failed.add(i)
                self.drained_until[i] = time.monotonic() + self.drain_seconds
                self.drains += 1
                if len(failed) == len(self.clients):
                    raise  # every endpoint failed this request: the rollout records the last error
                if route is not None:
                    route.endpoint = None  # the group moves with it
            finally:
                self.pending[i] -= 1

    def _pick(self, route: GroupRoute | None, failed: set[int]) -> int:
        """The group's endpoint if it is live, else the least pending live one (a drained one when
        every other has failed this request)."""
        now = time.monotonic()
        untried = [i for i in range(len(self.clients)) if i not in failed]
        live = [i for i in untried if self.drained_until[i] <= now] or untried
        if route is not None and route.endpoint in live:
            return route.endpoint
        choice = min(live, key=lambda i: self.pending[i])
        if route is not None:
            route.endpoint = choice
        return choice

    async def check(self, timeout: float = 10.0) -> list[str]:
        """Check each endpoint (``OpenAIClient.check``): one that cannot be reached is drained and
        named in the list returned; when none can, the first one's error is raised. An endpoint that
        answers but refuses (a wrong key, another model) raises: that is the user's to fix."""
        unreachable: list[str] = []
        first: ModelConnectionError | None = None
        for i, client in enumerate(self.clients):
            try:
                await client.check(timeout)
            except ModelConnectionError as exc:
                first = first or exc
                unreachable.append(str(exc))
                self.drained_until[i] = time.monotonic() + self.drain_seconds
        if first is not None and len(unreachable) == len(self.clients):
            raise first
        self.token_ids = self.clients[0].token_ids
        return unreachable

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()
