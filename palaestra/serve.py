"""An OpenAI-compatible chat server over any ``ModelClient`` (``palaestra serve``).

``create_app(client)`` is an aiohttp application answering ``GET /v1/models``, ``GET /health`` and
``POST /v1/chat/completions`` (the wire format is ``openai_api.py``'s), and with ``weights_from``
the weight-sync endpoints of vLLM an RL trainer uses (``serve_weights.py``); ``serve(client)`` runs it
until SIGINT/SIGTERM; ``running(client)`` runs it inside the current event loop on a free port.
The fake server tests use (``palaestra.testing``) is this same app over a scripted client.

- ``stream: true`` streams tokens as they are generated when the client can
  (``StreamingClient.chat_stream``, as ``LocalClient`` does); other clients' replies are sent as
  chunks once whole. A client that disconnects cancels its generation.
- Errors are OpenAI error JSON: 400 for a malformed body or field, 401 for a wrong API key, 404
  for an unknown model or route, 413 for a body over ``max_body_bytes``. A client that raises
  ``ValueError`` (asked for what the backend cannot do) gives a 400, anything else a 500; both
  name the exception, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from palaestra.clients.base import ModelClient, StreamingClient
from palaestra.openai_api import (
    ChatRequest,
    ChunkWriter,
    RequestError,
    completion,
    error_body,
    parse_request,
    replay,
)
from palaestra.runner import run_async

logger = logging.getLogger("palaestra.serve")
MAX_BODY_BYTES = 16 * 1024 * 1024
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An OpenAI-style error response."""
    body = error_body(status, message, param=param, code=code)
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def _json(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


class ChatServer:
    """The handlers of one app: ``client`` served under ``model_names`` (the first is its own);
    ``models`` maps every name answered to the client that answers it (weight sync adds adapters)."""

    def __init__(self, client: ModelClient, model_names: tuple[str, ...], tokenizer: Any) -> None:
        self.client = client
        self.models: dict[str, ModelClient] = dict.fromkeys(model_names, client)
        self.tokenizer = tokenizer

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(self.models)

    async def models_list(self, request: web.Request) -> web.Response:
        entries = [{"id": n, "object": "model", "created": 0, "owned_by": "palaestra"} for n in self.models]
        return _json({"object": "list", "data": entries})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return error_response(400, "We could not parse the JSON body of your request.")
        try:
            parsed = parse_request(body, self.model_names)
        except RequestError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        client = self.models[parsed.model]
        if parsed.stream and isinstance(client, StreamingClient):
            return await self._stream(request, parsed, client)
        try:
            reply = await client.chat(parsed.messages, tools=parsed.tools, sampling=parsed.sampling)
        except Exception as exc:  # noqa: BLE001 - a failing client is an error response, not a crash
            return self._client_error(exc)
        result = completion(reply, parsed, model=parsed.model, tokenizer=self.tokenizer)
        if not parsed.stream:
            return _json(result)
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        for event in replay(result, include_usage=parsed.include_usage):
            await response.write(event)
        return response

    async def _stream(
        self, request: web.Request, parsed: ChatRequest, client: StreamingClient
    ) -> web.StreamResponse:
        """Send tokens as the client generates them; leaving early (a disconnect) cancels it."""
        chunks = client.chat_stream(parsed.messages, tools=parsed.tools, sampling=parsed.sampling)
        writer = ChunkWriter(parsed.model, include_usage=parsed.include_usage)
        async with contextlib.aclosing(chunks):
            try:
                first = await anext(chunks)
            except Exception as exc:  # noqa: BLE001 - failed before any output: a plain error response
                return self._client_error(exc)
            response = web.StreamResponse(headers=SSE_HEADERS)
            await response.prepare(request)
            await response.write(writer.delta({"role": "assistant", "content": ""}))
            chunk = first
            while chunk.response is None:  # a write to a caller that left raises and ends this
                if chunk.text:
                    await response.write(writer.delta({"content": chunk.text}))
                try:
                    chunk = await anext(chunks)
                except Exception as exc:
                    logger.exception("model client failed mid-stream")
                    message = f"The model client raised: {type(exc).__name__}: {exc}"
                    await response.write(writer.error(500, message))
                    return response
            if chunk.text:
                await response.write(writer.delta({"content": chunk.text}))
            reply = chunk.response
            result = completion(reply, parsed, model=parsed.model, tokenizer=self.tokenizer)
            for event in writer.end(result):
                await response.write(event)
        return response

    def _client_error(self, exc: Exception) -> web.Response:
        # a ValueError from the client: the backend cannot do what was asked, the caller's to fix
        if isinstance(exc, ValueError):
            return error_response(400, f"The model client refused the request: {type(exc).__name__}: {exc}")
        logger.exception("model client failed")
        return error_response(500, f"The model client raised: {type(exc).__name__}: {exc}")


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own errors (unknown route, wrong method, body too large) as OpenAI error JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, f"{exc.reason}: {request.method} {request.path}")
    except (ConnectionResetError, asyncio.CancelledError):  # the caller went away mid-request
        raise
    except OSError as exc:  # a body cut short by a disconnect
        return error_response(400, f"could not read the request: {exc}")


def _require_key(api_key: str) -> Middleware:
    """Answer 401 unless ``Authorization: Bearer <api_key>`` (compared in constant time)."""
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode()
        if hmac.compare_digest(given, expected):
            return await handler(request)
        msg = "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'."
        return error_response(401, msg, code="invalid_api_key")

    return require_key


def create_app(
    client: ModelClient,
    *,
    model_names: Sequence[str] | None = None,
    tokenizer: Any = None,
    api_key: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    middlewares: Sequence[Middleware] = (),
    weights_from: str | None = None,
) -> web.Application:
    """The OpenAI-compatible app over ``client``, answering to ``model_names`` (default: its own).

    ``tokenizer`` (anything with ``decode(list[int]) -> str``; default: ``client.tokenizer`` if
    present) turns token ids into the ``token`` text of logprobs entries. ``middlewares`` run
    inside the error and API-key ones (the fake server's fault injection is one). ``weights_from``
    (the model folder a ``LocalClient`` was loaded from) adds the weight-sync endpoints an RL
    trainer uses (``serve_weights.py``).
    """
    names = tuple(model_names or (client.model,))
    tokenizer = tokenizer if tokenizer is not None else getattr(client, "tokenizer", None)
    server = ChatServer(client, names, tokenizer)
    chain = [_errors, *([_require_key(api_key)] if api_key else []), *middlewares]
    app = web.Application(client_max_size=max_body_bytes, middlewares=chain)
    app.router.add_get("/v1/models", server.models_list)
    app.router.add_get("/health", server.health)
    app.router.add_post("/v1/chat/completions", server.chat)
    if weights_from is not None:
        from palaestra.serve_weights import add_weight_sync

        add_weight_sync(app, server, weights_from)
    return app


# --- running ------------------------------------------------------------------------------


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one. Raises ``OSError`` if taken."""
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)


def base_url(sock: socket.socket) -> str:
    """``http://HOST:PORT/v1`` for a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"


ACCESS_LOG_FORMAT = '%a "%r" %s %b %Tfs'  # client, request line, status, bytes, seconds: never a header


def access_logger() -> logging.Logger:
    """``palaestra.serve.access``: one line per request on stderr (``--access-log``)."""
    logger = logging.getLogger("palaestra.serve.access")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


async def start(
    app: web.Application, host: str, port: int, *, grace: float = 2.0, access_log: bool = False
) -> tuple[web.AppRunner, str]:
    """Bind and serve ``app`` from this event loop; returns the runner (``cleanup()`` stops it) and URL.
    ``access_log``: a line per request to ``access_logger()``."""
    sock = bind(host, port)
    runner = web.AppRunner(
        app,
        access_log=access_logger() if access_log else None,
        access_log_format=ACCESS_LOG_FORMAT,
        handle_signals=False,
        handler_cancellation=True,
        shutdown_timeout=grace,
    )
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, base_url(sock)


def serve_until_signal(
    app: web.Application, host: str, port: int, announce: Callable[[str], str], *, access_log: bool = False
) -> None:
    """Serve ``app`` until SIGINT/SIGTERM, printing ``announce(url)`` once it listens. The signals
    are handled from before that line, so a stop from then on is clean; requests in flight get 2 s."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runner, url = await start(app, host, port, access_log=access_log)
        print(announce(url), flush=True)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    run_async(main())


@contextlib.asynccontextmanager
async def running(
    client: ModelClient,
    *,
    model_name: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    access_log: bool = False,
) -> AsyncIterator[str]:
    """Serve ``client`` from this event loop while the block runs (port 0: a free port).

    Yields the base URL (``http://127.0.0.1:PORT/v1``); on exit, requests still running get
    2 s to finish.
    """
    app = create_app(client, model_names=[model_name] if model_name else None, api_key=api_key)
    runner, url = await start(app, host, port, access_log=access_log)
    try:
        yield url
    finally:
        await runner.cleanup()


def serve(
    client: ModelClient,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    model_names: Sequence[str] | None = None,
    api_key: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    weights_from: str | None = None,
    access_log: bool = False,
) -> None:
    """Serve ``client`` until SIGINT/SIGTERM, printing ``serving MODEL at URL`` once listening.

    The server answers to ``model_names`` (default: ``model_name`` or the client's own name).
    Port 0 picks a free port (the line shows it). Raises ``OSError`` if the address cannot be
    bound (e.g. the port is taken). On a signal, requests in flight get 2 s to finish.
    """
    names = list(dict.fromkeys(model_names or [model_name or client.model]))
    app = create_app(
        client, model_names=names, api_key=api_key, max_body_bytes=max_body_bytes, weights_from=weights_from
    )

    also = f" (also as {', '.join(names[1:])})" if len(names) > 1 else ""
    key = "; requests need the API key" if api_key else ""
    serve_until_signal(
        app, host, port, lambda url: f"serving {names[0]}{also} at {url}{key}", access_log=access_log
    )
