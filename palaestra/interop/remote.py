"""``RemoteEnvironment``: an environment that lives behind ``palaestra env serve``, as a local one.

It is a palaestra ``Environment``: ``palaestra eval http://HOST:PORT -m MODEL``, ``env.run`` and
the trainers use it as any other. Its examples, tools, sampling and metrics come from the
server; each rollout is an episode there, played with the local model client: the server asks
(``/reset``, ``/step``), the client answers, and the server's rollout record (completion, state,
stop reason, errors) becomes the local one. Each turn's token ids and logprobs are the local
client's, sent along with the reply. Rollouts are scored on the server group by group
(``/score``), as the engine scores a local environment's, so rewards are the same.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from palaestra.clients.base import ModelClient
from palaestra.envs.base import Environment
from palaestra.types import ErrorInfo, Example, Rollout, Sampling, State

EPISODE_KEY = "remote_episode"  # in state.resources: the server's id of the rollout's episode
RETRIES_WHEN_FULL = 6
_run_seed: contextvars.ContextVar[int] = contextvars.ContextVar("palaestra_remote_run_seed", default=0)


class RemoteEnvironmentError(ConnectionError):
    """The environment server could not be reached or refused a request (its ``detail`` is the message)."""


def _get(url: str, timeout: float) -> Any:
    """A JSON GET for the environment's description (``__init__`` is synchronous)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RemoteEnvironmentError(f"{url}: HTTP {exc.code}: {_detail(exc.read())}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RemoteEnvironmentError(f"cannot reach the environment server at {url}: {exc}") from None


def _detail(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode(errors="replace")
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)


class RemoteRubric:
    """Scores a group of the remote environment's rollouts on the server (``POST /score``)."""

    parser_given = True

    def __init__(self, env: RemoteEnvironment, metrics: dict[str, dict[str, Any]]) -> None:
        self._env = env
        self._metrics = metrics

    @property
    def names(self) -> list[str]:
        return list(self._metrics)

    def describe(self) -> dict[str, dict[str, Any]]:
        return dict(self._metrics)

    def bind(self, columns: Sequence[str] = ()) -> None:
        """Reward functions are bound on the server."""

    async def score_group(self, rollouts: Sequence[Rollout], examples: Sequence[Example]) -> None:
        episodes = [
            r.state.resources.get(EPISODE_KEY) if isinstance(r.state, State) else None for r in rollouts
        ]
        todo = [(r, e) for r, e in zip(rollouts, episodes, strict=True) if e is not None and r.error is None]
        try:
            if todo:
                body = await self._env.call("/score", {"episode_ids": [e for _, e in todo]})
                for (rollout, _), result in zip(todo, body["results"], strict=True):
                    rollout.reward = result["reward"]
                    rollout.metrics.update(result["metrics"])
                    if result["error"] is not None:
                        rollout.error = ErrorInfo(
                            result["error"]["type"], result["error"]["message"], "scoring"
                        )
        except RemoteEnvironmentError as exc:
            for rollout, _ in todo:
                rollout.reward = None
                rollout.error = ErrorInfo(type(exc).__name__, f"in scoring: {exc}", "scoring")
        finally:
            await asyncio.gather(*(self._env.close_episode(e) for e in episodes if e is not None))


class RemoteEnvironment(Environment):
    """The environment served at ``url`` (``palaestra env serve NAME --port P`` → ``http://HOST:P``).

    ``request_timeout`` bounds each request to the server (the environment's turn included);
    ``timeout`` is this side's limit on a whole rollout, as for any environment.
    """

    def __init__(self, url: str, *, timeout: float | None = None, request_timeout: float = 300.0) -> None:
        self.url = url.rstrip("/")
        self.request_timeout = request_timeout
        meta = _get(f"{self.url}/metadata", min(request_timeout, 30.0))
        if not isinstance(meta, dict) or "num_examples" not in meta:
            raise RemoteEnvironmentError(f"{self.url} is not a palaestra environment server")
        super().__init__(
            sampling=Sampling.from_dict(meta["sampling"]),
            tools=meta["tools"],
            pass_threshold=meta["pass_threshold"],
            timeout=timeout,
        )
        self.name = str(meta["name"])
        self.rubric = RemoteRubric(self, meta["metrics"])  # type: ignore[assignment]  # scores on the server
        self.examples = self._fetch_examples(int(meta["num_examples"]))
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    def _fetch_examples(self, total: int) -> list[Example]:
        examples: list[Example] = []
        while len(examples) < total:
            page = _get(
                f"{self.url}/examples?offset={len(examples)}&limit=1000", min(self.request_timeout, 30.0)
            )
            if not page["examples"]:
                break
            for e in page["examples"]:
                row = {"prompt": e["prompt"], "answer": e["answer"], "info": e["info"]}
                examples.append(
                    Example(id=e["id"], prompt=e["prompt"], answer=e["answer"], info=e["info"], row=row)
                )
        return examples

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            timeout = aiohttp.ClientTimeout(total=self.request_timeout)
            session = self._sessions[loop] = aiohttp.ClientSession(timeout=timeout)
        return session

    async def call(self, path: str, body: dict[str, Any]) -> Any:
        """POST ``body`` to the server; ``RemoteEnvironmentError`` for a refusal or a lost server."""
        for attempt in range(RETRIES_WHEN_FULL + 1):
            try:
                async with self._session().post(self.url + path, data=orjson.dumps(body)) as response:
                    raw = await response.read()
                    if response.status == 503 and attempt < RETRIES_WHEN_FULL:  # full: episodes end soon
                        await asyncio.sleep(0.1 * 2**attempt)
                        continue
                    if response.status != 200:
                        raise RemoteEnvironmentError(f"{path}: HTTP {response.status}: {_detail(raw)}")
                    return orjson.loads(raw)
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
                raise RemoteEnvironmentError(f"{path}: {type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")

    async def close_episode(self, episode_id: str) -> None:
        """Release the episode on the server (it would be after its timeouts anyway); never raises."""
        try:
            await self.call("/close", {"episode_id": episode_id})
        except RemoteEnvironmentError:
            pass

    async def rollout(
        self,
        client: ModelClient,
        example: Example,
        *,
        rollout_index: int = 0,
        seed: int = 0,
        sampling: Sampling | None = None,
    ) -> Rollout:
        # the server derives the rollout's seed from the run's, as the engine does here
        token = _run_seed.set(seed)
        try:
            return await super().rollout(
                client, example, rollout_index=rollout_index, seed=seed, sampling=sampling
            )
        finally:
            _run_seed.reset(token)

    async def episode(self, client: ModelClient, rollout: Rollout, state: State, sampling: Sampling) -> None:
        reset = {
            "seed": _run_seed.get(),
            "example_id": rollout.example_id,
            "rollout_index": rollout.rollout_index,
            "sampling": dataclasses.asdict(sampling),
            "score": False,
        }
        body = await self.call("/reset", reset)
        episode_id = body["metadata"]["episode_id"]
        state.resources[EPISODE_KEY] = episode_id
        model_times: list[float] = []
        try:
            while not body["done"]:
                obs = body["observation"]
                rollout.tools = obs["tools"]
                t0 = time.perf_counter()
                response = await client.chat(
                    obs["messages"], tools=obs["tools"], sampling=Sampling.from_dict(obs["sampling"])
                )
                model_times.append(time.perf_counter() - t0)
                usage = dataclasses.asdict(response.usage)
                action = {
                    "message": response.message,
                    "finish_reason": response.finish_reason,
                    "token_ids": response.token_ids,
                    "logprobs": response.logprobs,
                    "prompt_token_ids": response.prompt_token_ids,
                    "usage": usage,
                }
                body = await self.call(
                    "/step", {"episode_id": episode_id, "turn": obs["turn"], "action": action}
                )
            final = await self.call_state(episode_id)
        except BaseException:
            state.resources.pop(EPISODE_KEY, None)
            await asyncio.shield(self.close_episode(episode_id))
            raise
        _adopt(rollout, state, Rollout.from_dict(final["rollout"]), model_times)

    async def call_state(self, episode_id: str) -> Any:
        try:
            params = {"episode_id": episode_id}
            async with self._session().get(f"{self.url}/state", params=params) as response:
                raw = await response.read()
                if response.status != 200:
                    raise RemoteEnvironmentError(f"/state: HTTP {response.status}: {_detail(raw)}")
                return orjson.loads(raw)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RemoteEnvironmentError(f"/state: {type(exc).__name__}: {exc}") from None

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()


def _adopt(rollout: Rollout, state: State, served: Rollout, model_times: list[float]) -> None:
    """The server's record of the episode becomes the rollout (model times are this side's)."""
    rollout.completion = served.completion
    rollout.turns = served.turns
    for turn, seconds in zip(rollout.turns, model_times, strict=False):
        turn.model_time = seconds
    rollout.usage = served.usage
    rollout.tools = served.tools
    rollout.stop_reason = served.stop_reason
    rollout.error = served.error
    rollout.timing.model = sum(model_times)
    rollout.timing.env = served.timing.env
    state.update(served.state)
    state.turn = len(served.turns)
