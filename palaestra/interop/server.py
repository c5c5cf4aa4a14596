"""An environment behind HTTP (``palaestra env serve``): a trainer in another process drives episodes.

``create_env_app(env)`` is an aiohttp application with OpenEnv's ``POST /reset``, ``POST /step``
and ``GET /state`` (one server, many episodes, each named by its ``episode_id``), plus
``GET /health``, ``GET /metadata``, ``GET /examples``, ``POST /score`` (score finished episodes of
one example as a group) and ``POST /close``. The wire format is ``wire.py``'s and
docs/interop.md's. Episodes run as ``episodes.py`` describes: an episode whose caller goes away
ends after ``idle_timeout`` and is released, its environment's cleanup run.

Errors are ``{"detail": message, "code": code}`` with a 4xx status: 400 for a malformed body or
field, 404 for an unknown example, episode or route, 405 for a wrong method, 409 for a step the
episode cannot take now (ended, out of order, another step still playing), 410 for an episode
already released, 413 for a body over ``max_body_bytes``, 503 when ``max_episodes`` are open.
A rejected request leaves its episode as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from palaestra._version import __version__
from palaestra.envs.base import Environment
from palaestra.interop import wire
from palaestra.interop.episodes import EpisodeProblem, Episodes
from palaestra.serve import serve_until_signal, start

MAX_BODY_BYTES = 4 * 1024 * 1024
EPISODES: web.AppKey[Episodes] = web.AppKey("episodes", Episodes)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


def problem(status: int, code: str, message: str) -> web.Response:
    return _json({"detail": message, "code": code}, status)


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw.strip():
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise wire.bad(f"the request body is not valid JSON: {exc}", "invalid_json") from None


class EnvServer:
    """The handlers over one environment and its table of episodes."""

    def __init__(self, env: Environment, episodes: Episodes, name: str) -> None:
        self.env = env
        self.episodes = episodes
        self.name = name

    async def health(self, request: web.Request) -> web.Response:
        return _json({"status": "healthy", "episodes": self.episodes.counts()})

    async def metadata(self, request: web.Request) -> web.Response:
        doc = (type(self.env).__doc__ or "").strip().splitlines()
        return _json(
            {
                "name": self.name,
                "description": doc[0] if doc else "",
                "version": __version__,
                "num_examples": len(self.env.examples),
                "tools": self.env.tool_schemas(),
                "sampling": wire.sampling_dict(self.env.sampling),
                "metrics": self.env.metric_info(),
                "pass_threshold": self.env.pass_threshold,
                "idle_timeout": self.episodes.idle_timeout,
                "keep_finished": self.episodes.keep_finished,
                "max_episodes": self.episodes.max_episodes,
            }
        )

    async def examples(self, request: web.Request) -> web.Response:
        try:
            offset = int(request.query.get("offset", "0"))
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            raise wire.bad("'offset' and 'limit' must be integers") from None
        if offset < 0 or not 1 <= limit <= 1000:
            raise wire.bad("'offset' must be >= 0 and 'limit' in [1, 1000]")
        page = self.env.examples[offset : offset + limit]
        return _json({"total": len(self.env.examples), "examples": [wire.example_dict(e) for e in page]})

    async def reset(self, request: web.Request) -> web.Response:
        if not self.env.examples:
            raise EpisodeProblem(404, "unknown_example", "the environment has no examples")
        parsed = wire.parse_reset(await _body(request), len(self.env.examples))
        episode = self.episodes.start(
            self.env.examples[parsed.example_id],
            seed=parsed.seed,
            rollout_index=parsed.rollout_index,
            sampling=parsed.sampling or self.env.sampling,
            auto_score=parsed.score,
            episode_id=parsed.episode_id,
        )
        await episode.settle()  # a caller leaving now leaves the episode to its idle timeout
        return _json(wire.observation(episode, -1))

    async def step(self, request: web.Request) -> web.Response:
        parsed = wire.parse_step(await _body(request))
        episode = self.episodes.get(parsed.episode_id)
        answered = len(episode.pending.messages) if episode.waiting() and episode.pending else 0
        episode.act(parsed.response, parsed.turn)
        episode.stepping = True
        try:
            await episode.settle()
        finally:
            episode.stepping = False
        return _json(wire.observation(episode, answered))

    async def state(self, request: web.Request) -> web.Response:
        given = request.query.get("episode_id")
        if given is None:
            raise wire.bad("GET /state needs ?episode_id=...: this server runs many episodes")
        return _json(wire.state(self.episodes.get(given)))

    async def score(self, request: web.Request) -> web.Response:
        episodes = await self.episodes.score_group(wire.parse_ids(await _body(request)))
        results = []
        for episode in episodes:
            rollout = episode.rollout
            assert rollout is not None  # score_group checked
            error = {"type": rollout.error.type, "message": rollout.error.message} if rollout.error else None
            results.append(
                {
                    "episode_id": episode.id,
                    "reward": rollout.reward,
                    "metrics": rollout.metrics,
                    "error": error,
                }
            )
        return _json({"results": results})

    async def close(self, request: web.Request) -> web.Response:
        body = wire._object(await _body(request), "the request body")
        episode_id = wire.episode_id(body)
        assert episode_id is not None  # required
        episode = await self.episodes.close(episode_id)
        return _json({"episode_id": episode.id, "closed": True})


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal as ``{"detail", "code"}`` JSON, aiohttp's own (404, 405, 413) too."""
    try:
        return await handler(request)
    except EpisodeProblem as exc:
        return problem(exc.status, exc.code, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(
            exc.status, "http_error"
        )
        return problem(exc.status, code, f"{exc.reason}: {request.method} {request.path}")


def create_env_app(
    env: Environment,
    *,
    name: str = "environment",
    idle_timeout: float = 300.0,
    keep_finished: float | None = None,
    max_episodes: int = 1024,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> web.Application:
    """The HTTP app over ``env``; episodes waiting ``idle_timeout`` s for a step are ended, finished
    ones released ``keep_finished`` s (default ``idle_timeout``) after they ended."""
    episodes = Episodes(
        env, idle_timeout=idle_timeout, keep_finished=keep_finished, max_episodes=max_episodes
    )
    server = EnvServer(env, episodes, name)
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_errors])
    app[EPISODES] = episodes
    app.router.add_get("/health", server.health)
    app.router.add_get("/metadata", server.metadata)
    app.router.add_get("/examples", server.examples)
    app.router.add_post("/reset", server.reset)
    app.router.add_post("/step", server.step)
    app.router.add_get("/state", server.state)
    app.router.add_post("/score", server.score)
    app.router.add_post("/close", server.close)
    app.cleanup_ctx.append(_housekeeping)
    return app


async def _housekeeping(app: web.Application) -> AsyncIterator[None]:
    """Release finished episodes on time even when no request comes; end them all on shutdown."""
    episodes = app[EPISODES]

    async def sweep() -> None:
        while True:
            await asyncio.sleep(min(1.0, max(episodes.keep_finished, 0.05)))
            episodes.forget_expired()

    task = asyncio.create_task(sweep())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await episodes.aclose()
    await episodes.env.aclose()


async def start_env_server(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Bind and serve ``app`` from this event loop; returns the runner (``cleanup()`` stops it) and URL."""
    runner, url = await start(app, host, port)
    return runner, url.removesuffix("/v1")


@contextlib.asynccontextmanager
async def serving(
    env: Environment, *, host: str = "127.0.0.1", port: int = 0, **options: Any
) -> AsyncIterator[str]:
    """Serve ``env`` from this event loop while the block runs; yields the base URL (port 0: a free one)."""
    runner, url = await start_env_server(create_env_app(env, **options), host, port)
    try:
        yield url
    finally:
        await runner.cleanup()


def serve_env(
    env: Environment, *, name: str, host: str = "127.0.0.1", port: int = 8100, **options: Any
) -> None:
    """Serve ``env`` until SIGINT/SIGTERM, printing ``serving environment NAME at URL`` once listening."""
    app = create_env_app(env, name=name, **options)

    announce = f"serving environment {name} ({len(env.examples)} examples) at {{}}"
    serve_until_signal(app, host, port, lambda url: announce.format(url.removesuffix("/v1")))
