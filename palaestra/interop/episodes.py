"""Episodes of an environment driven from outside: the environment asks, a caller answers.

An ``Episode`` runs the environment's own ``rollout`` in a task, with a ``TurnClient`` as the
model: each time the environment asks the model for a reply, that request waits (as a
``Pending`` turn) until the caller answers it with ``Episode.act``. So any environment runs
unchanged (a ``MultiTurnEnv``, a custom ``episode``, a verifiers package through the compat
layer) and the rollout it records is the one ``palaestra eval`` records for the same seed.

``Episodes`` is the table a server keeps: it starts episodes (at most ``max_episodes`` at once),
ends those whose caller stopped answering (``idle_timeout``: the model request fails with
``CallerTimeout``, so the environment's ``cleanup_state`` runs as after any failure), and forgets
finished ones ``keep_finished`` seconds after they ended, so no resource outlives its caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from palaestra.clients.base import ModelError
from palaestra.envs.base import Environment
from palaestra.types import ErrorInfo, Example, Messages, ModelResponse, Rollout, Sampling

GONE_REMEMBERED = 10_000  # ids of released episodes kept, to tell "released" from "never existed"


class CallerTimeout(ModelError):
    """Nobody answered an episode's model turn within the server's ``idle_timeout``."""


class EpisodeProblem(Exception):
    """A request an episode cannot take; ``status`` is the HTTP status a server answers with."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass
class Pending:
    """A model request of the environment, waiting for the caller's reply."""

    messages: Messages
    tools: list[dict[str, Any]] | None
    sampling: Sampling
    reply: asyncio.Future[ModelResponse]


class TurnClient:
    """The model of an externally driven episode: each ``chat`` waits for the caller's reply."""

    model = "caller"

    def __init__(self, episode: Episode, idle_timeout: float) -> None:
        self._episode = episode
        self._idle_timeout = idle_timeout
        self._one_at_a_time = asyncio.Lock()  # an environment asking twice at once is answered in turn

    async def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> ModelResponse:
        async with self._one_at_a_time:
            reply: asyncio.Future[ModelResponse] = asyncio.get_running_loop().create_future()
            self._episode.offer(Pending(list(messages), tools, sampling, reply))
            try:
                async with asyncio.timeout(self._idle_timeout):
                    return await reply
            except TimeoutError:
                raise CallerTimeout(
                    f"no reply to turn {self._episode.turn} within {self._idle_timeout:g}s: episode ended"
                ) from None
            finally:
                self._episode.pending = None


@dataclass
class Episode:
    """One episode: its task, the model turn it waits on, and its result once it ended."""

    id: str
    env: Environment
    example: Example
    seed: int
    rollout_index: int
    sampling: Sampling
    auto_score: bool
    idle_timeout: float
    turn: int = 0  # replies accepted so far
    pending: Pending | None = None
    stepping: bool = False  # a caller's step is being played
    scored: bool = False
    last_prompt: Messages = field(default_factory=list)  # what the model was last asked to answer
    ended_at: float | None = None
    task: asyncio.Task[Rollout] = field(init=False)
    _changed: asyncio.Event = field(init=False, default_factory=asyncio.Event)

    def start(self) -> None:
        self.task = asyncio.create_task(self._play(), name=f"episode {self.id}")
        self.task.add_done_callback(self._ended)

    async def _play(self) -> Rollout:
        client = TurnClient(self, self.idle_timeout)
        rollout = await self.env.rollout(
            client, self.example, rollout_index=self.rollout_index, seed=self.seed, sampling=self.sampling
        )
        if self.auto_score:
            await score(self.env, [rollout], self.example)
            self.scored = True
        return rollout

    def _ended(self, task: asyncio.Task[Rollout]) -> None:
        self.ended_at = time.monotonic()
        self._changed.set()

    def offer(self, pending: Pending) -> None:
        """The environment asks for a reply (called by ``TurnClient``)."""
        self.pending = pending
        self.last_prompt = pending.messages
        self._changed.set()

    @property
    def done(self) -> bool:
        return self.task.done()

    @property
    def rollout(self) -> Rollout | None:
        """The finished rollout (``None`` while running, or if the episode was cancelled)."""
        if not self.task.done() or self.task.cancelled():
            return None
        return self.task.result()

    def waiting(self) -> bool:
        """Whether the episode waits for the caller's reply."""
        return self.pending is not None and not self.pending.reply.done()

    async def settle(self) -> None:
        """Wait until the episode waits for a reply or has ended; the episode itself is never cancelled."""
        while not (self.done or self.waiting()):
            self._changed.clear()
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({self.task, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()

    def act(self, response: ModelResponse, turn: int | None) -> None:
        """Answer the model turn the episode waits on; ``EpisodeProblem`` if it waits on none."""
        if self.done:
            raise EpisodeProblem(409, "episode_done", f"episode {self.id} has ended: it takes no more steps")
        if self.stepping:
            raise EpisodeProblem(409, "step_in_progress", f"episode {self.id} is still playing the last step")
        if turn is not None and turn != self.turn:
            raise EpisodeProblem(
                409,
                "out_of_order",
                f"the step is for turn {turn}, but episode {self.id} is at turn {self.turn}",
            )
        if not self.waiting():
            raise EpisodeProblem(409, "not_waiting", f"episode {self.id} is not waiting for a reply")
        assert self.pending is not None  # waiting() says so
        self.pending.reply.set_result(response)
        self.turn += 1

    async def cancel(self) -> None:
        """End the episode now; its environment's cleanup runs before this returns."""
        if not self.task.done():
            self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def score(env: Environment, rollouts: Sequence[Rollout], example: Example) -> None:
    """Score ``rollouts`` (of one example) as one group, as the engine does; never raises."""
    try:
        await env.rubric.score_group(list(rollouts), [example] * len(rollouts))
    except Exception as exc:  # noqa: BLE001 - recorded on the rollouts, as any scoring failure
        for rollout in rollouts:
            rollout.reward = None
            rollout.error = rollout.error or ErrorInfo(type(exc).__name__, f"in scoring: {exc}", "scoring")


class Episodes:
    """The episodes a server is running or has just finished, by id."""

    def __init__(
        self,
        env: Environment,
        *,
        idle_timeout: float = 300.0,
        keep_finished: float | None = None,
        max_episodes: int = 1024,
    ) -> None:
        if not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be a positive number of seconds, got {idle_timeout!r}")
        if max_episodes < 1:
            raise ValueError(f"max_episodes must be at least 1, got {max_episodes!r}")
        self.env = env
        self.idle_timeout = idle_timeout
        self.keep_finished = idle_timeout if keep_finished is None else keep_finished
        self.max_episodes = max_episodes
        self.live: dict[str, Episode] = {}
        self._gone: OrderedDict[str, str] = OrderedDict()  # released id -> why

    def start(
        self,
        example: Example,
        *,
        seed: int,
        rollout_index: int,
        sampling: Sampling,
        auto_score: bool,
        episode_id: str | None = None,
    ) -> Episode:
        """A new running episode; ``EpisodeProblem`` if the id is taken or the table is full."""
        self.forget_expired()
        if len(self.live) >= self.max_episodes:
            raise EpisodeProblem(
                503, "capacity", f"{self.max_episodes} episodes are open: finish or close one, then retry"
            )
        if episode_id is None:
            episode_id = uuid.uuid4().hex
        elif episode_id in self.live:
            raise EpisodeProblem(409, "episode_exists", f"episode {episode_id!r} exists: choose another id")
        self._gone.pop(episode_id, None)
        episode = Episode(
            id=episode_id,
            env=self.env,
            example=example,
            seed=seed,
            rollout_index=rollout_index,
            sampling=sampling,
            auto_score=auto_score,
            idle_timeout=self.idle_timeout,
        )
        episode.start()
        self.live[episode_id] = episode
        return episode

    def get(self, episode_id: str) -> Episode:
        """The episode ``episode_id``; ``EpisodeProblem`` 410 if it was released, 404 if never known."""
        self.forget_expired()
        episode = self.live.get(episode_id)
        if episode is not None:
            return episode
        why = self._gone.get(episode_id)
        if why is not None:
            raise EpisodeProblem(410, "episode_released", f"episode {episode_id!r} was released ({why})")
        raise EpisodeProblem(404, "unknown_episode", f"no episode {episode_id!r} on this server")

    async def close(self, episode_id: str) -> Episode:
        """End the episode (if running) and release it."""
        episode = self.get(episode_id)
        self._release(episode_id, "closed by the caller")
        await episode.cancel()
        return episode

    async def score_group(self, episode_ids: Sequence[str]) -> list[Episode]:
        """Score finished, unscored episodes of one example together, as one group."""
        if not episode_ids:
            raise EpisodeProblem(400, "invalid_request", "'episode_ids' must name at least one episode")
        if len(set(episode_ids)) != len(episode_ids):
            raise EpisodeProblem(400, "invalid_request", "'episode_ids' names an episode twice")
        episodes = [self.get(i) for i in episode_ids]
        for episode in episodes:
            if not episode.done:
                raise EpisodeProblem(409, "episode_running", f"episode {episode.id} has not ended yet")
            if episode.scored:
                raise EpisodeProblem(409, "already_scored", f"episode {episode.id} is scored already")
            if episode.rollout is None:
                raise EpisodeProblem(409, "episode_cancelled", f"episode {episode.id} was cancelled")
        if len({e.example.id for e in episodes}) > 1:
            raise EpisodeProblem(400, "invalid_request", "a group's episodes must all play the same example")
        for episode in episodes:  # before the await: a second request for the same ids is refused
            episode.scored = True
        await score(self.env, [e.rollout for e in episodes if e.rollout is not None], episodes[0].example)
        return episodes

    def forget_expired(self) -> None:
        """Release episodes that ended more than ``keep_finished`` seconds ago."""
        now = time.monotonic()
        for episode_id, episode in list(self.live.items()):
            if episode.ended_at is not None and now - episode.ended_at >= self.keep_finished:
                self._release(episode_id, f"ended more than {self.keep_finished:g}s ago")

    def _release(self, episode_id: str, why: str) -> None:
        self.live.pop(episode_id, None)
        self._gone[episode_id] = why
        while len(self._gone) > GONE_REMEMBERED:
            self._gone.popitem(last=False)

    def counts(self) -> dict[str, int]:
        running = sum(not e.done for e in self.live.values())
        return {"running": running, "finished": len(self.live) - running, "max": self.max_episodes}

    async def aclose(self) -> None:
        """End every episode (the server is stopping)."""
        episodes = list(self.live.values())
        for episode_id in list(self.live):
            self._release(episode_id, "the server stopped")
        await asyncio.gather(*(e.cancel() for e in episodes), return_exceptions=True)
