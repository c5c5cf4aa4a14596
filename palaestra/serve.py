"""An OpenAI-compatible chat server over any ``ModelClient``, so any OpenAI client can use it.

``create_app(client)`` is a Starlette app answering ``GET /v1/models`` and
``POST /v1/chat/completions``; ``serve(client)`` runs it under uvicorn (``palaestra serve``);
``running(client)`` runs it inside the current event loop on a free port (tests, benchmarks).

Request fields: ``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens`` (the
latter wins), ``stop`` (a string or a list), ``seed`` and ``logprobs`` become ``Sampling``
fields; ``tools`` is passed to the client. Caller metadata (``user``, ``metadata``, ``store``,
...), nulls and OpenAI defaults (``tool_choice: "auto"``, zero penalties, ...) are dropped; any
other field (``top_k``, ``min_p``, ``response_format``, ...) goes to ``Sampling.extra``, where a
backend that cannot honour it should raise ``ValueError`` (as ``LocalClient`` does). Decisions:

- ``n`` must be 1 (else 400): one choice per request; send n requests, they run concurrently.
- ``top_logprobs`` > 0 is a 400: a ``ModelClient`` returns only the chosen tokens' logprobs.
  ``logprobs.content`` entries carry ``top_logprobs: []``; their ``token`` is the token's text
  when a tokenizer is known (``tokenizer=``, or the client's ``tokenizer`` attribute), else
  ``token_id:N`` (vLLM's ``--return-tokens-as-token-ids`` form, which ``OpenAIClient`` reads back).
- ``return_token_ids: true`` adds vLLM's ``choices[0].token_ids`` (null if the client gave none).
- Streaming is honest replay: ``ModelClient.chat`` returns a whole reply, so ``stream: true``
  waits for it, then sends it as ``chat.completion.chunk`` events (role, one chunk per word,
  tool calls, then ``finish_reason`` with any logprobs / token ids, an optional usage chunk and
  ``data: [DONE]``). Tokens are not streamed while being generated.
- Bad requests get OpenAI error JSON: 400 (malformed body or field), 404 (unknown model or route).
  A client that raises ``ValueError`` (the request asks what this backend cannot do) gives a
  400, any other exception a 500; both name the exception, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route
except ImportError as exc:  # an optional extra
    raise ImportError(f"palaestra serve needs {exc.name}: pip install 'palaestra[serve]'") from exc

from palaestra.clients.base import ModelClient
from palaestra.types import ModelResponse, Sampling

logger = logging.getLogger("palaestra.serve")

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
HANDLED = frozenset(  # fields this module reads itself
    "model messages tools temperature top_p max_tokens max_completion_tokens stop seed logprobs"
    " top_logprobs n stream stream_options return_token_ids".split()
)
METADATA = frozenset("user metadata store service_tier prompt_cache_key safety_identifier".split())
DEFAULTS = {"tool_choice": "auto", "parallel_tool_calls": True, "frequency_penalty": 0, "presence_penalty": 0}


class RequestError(Exception):
    """A request this server will not answer; becomes an OpenAI error response."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@dataclass
class ChatRequest:
    """A validated ``/v1/chat/completions`` body, in the terms of a ``ModelClient`` call."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False


def parse_request(body: Any, model_name: str) -> ChatRequest:
    """Check a chat-completion body and map it to a ``ChatRequest``; raises ``RequestError``."""
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str):
        raise RequestError(400, "You must provide a model (a string).", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list of message objects.", param="messages")
    for i, message in enumerate(messages):
        if (problem := _message_problem(message)) is not None:
            raise RequestError(400, f"messages[{i}]: {problem}", param=f"messages[{i}]")
    if model != model_name:
        msg = f"The model `{model}` does not exist; this server serves `{model_name}`."
        raise RequestError(404, msg, param="model", code="model_not_found")

    tools = _typed(body, "tools", list)
    if tools is not None and not all(isinstance(t, dict) for t in tools):
        raise RequestError(400, "'tools' must be a list of objects.", param="tools")
    max_tokens = None
    for key in ("max_tokens", "max_completion_tokens"):  # the newer name wins when both are given
        value = _typed(body, key, int)
        if value is not None and value <= 0:
            raise RequestError(400, f"'{key}' must be at least 1, not {value}.", param=key)
        max_tokens = value if value is not None else max_tokens
    temperature = _typed(body, "temperature", float)
    if temperature is not None and temperature < 0:
        raise RequestError(400, f"'temperature' must be >= 0, not {temperature}.", param="temperature")
    top_p = _typed(body, "top_p", float)
    if top_p is not None and not 0 < top_p <= 1:
        raise RequestError(400, f"'top_p' must be in (0, 1], not {top_p}.", param="top_p")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    elif stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise RequestError(400, "'stop' must be a string or a list of strings.", param="stop")
    if _typed(body, "n", int) not in (None, 1):
        msg = "'n' must be 1: this server returns one choice per request (send n requests instead)."
        raise RequestError(400, msg, param="n", code="unsupported_value")
    top_logprobs = _typed(body, "top_logprobs", int)
    if top_logprobs is not None and top_logprobs != 0:
        msg = "'top_logprobs' must be 0: only the chosen tokens' logprobs are available."
        raise RequestError(400, msg, param="top_logprobs", code="unsupported_value")
    options = _typed(body, "stream_options", dict) or {}
    sampling = Sampling(
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        stop=stop or None,
        seed=_typed(body, "seed", int),
        logprobs=bool(_typed(body, "logprobs", bool)),
        extra={k: v for k, v in body.items() if _passed_on(k, v)},
    )
    return ChatRequest(
        messages=messages,
        tools=tools or None,
        sampling=sampling,
        stream=bool(_typed(body, "stream", bool)),
        include_usage=bool(_typed(options, "include_usage", bool)),
        return_token_ids=bool(_typed(body, "return_token_ids", bool)),
    )


def _passed_on(key: str, value: Any) -> bool:
    """Whether a body field goes to ``Sampling.extra``: not handled here, not metadata, not a default."""
    return (
        key not in HANDLED and key not in METADATA and value is not None and DEFAULTS.get(key, ...) != value
    )


def _typed(body: dict[str, Any], key: str, kind: type) -> Any:
    """``body[key]`` if absent/null or of ``kind`` (an int counts as a float, a bool as neither)."""
    value = body.get(key)
    if value is None:
        return None
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        names = {bool: "a boolean", int: "an integer", float: "a number", list: "a list", dict: "an object"}
        raise RequestError(400, f"'{key}' must be {names[kind]}, not {value!r:.50}.", param=key)
    return value


def _message_problem(message: Any) -> str | None:
    """Why ``message`` is not a chat message, or None."""
    if not isinstance(message, dict):
        return "each message must be an object."
    role = message.get("role")
    if role not in ROLES:
        return f"'role' must be one of {', '.join(ROLES)}, not {role!r:.50}."
    content = message.get("content")
    if content is not None and not isinstance(content, (str, list)):
        return "'content' must be a string or a list of content parts."
    if content is None and not (role == "assistant" and message.get("tool_calls")):
        return f"a {role} message needs 'content'."
    if message.get("tool_calls") is not None and not isinstance(message["tool_calls"], list):
        return "'tool_calls' must be a list."
    return None


# --- the app ------------------------------------------------------------------------------


def create_app(client: ModelClient, *, model_name: str | None = None, tokenizer: Any = None) -> Starlette:
    """The OpenAI-compatible app over ``client``, serving it as ``model_name`` (default ``client.model``).

    ``tokenizer`` (anything with ``decode(list[int]) -> str``; default: ``client.tokenizer`` if
    present) turns token ids into the ``token`` text of logprobs entries.
    """
    name = model_name or client.model
    tokenizer = tokenizer if tokenizer is not None else getattr(client, "tokenizer", None)
    created = int(time.time())
    model_entry = {"id": name, "object": "model", "created": created, "owned_by": "palaestra"}

    async def models(request: Request) -> Response:
        return _json({"object": "list", "data": [model_entry]})

    async def chat(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return error_response(400, "We could not parse the JSON body of your request.")
        try:
            parsed = parse_request(body, name)
        except RequestError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        reply: ModelResponse | None = None
        try:
            reply = await client.chat(parsed.messages, tools=parsed.tools, sampling=parsed.sampling)
            result = completion(reply, parsed, model=name, tokenizer=tokenizer)
        except Exception as exc:
            # a ValueError from the client: the backend cannot do what was asked, the caller's to fix
            refused = reply is None and isinstance(exc, ValueError)
            if not refused:
                logger.exception("model client failed")
            what = "refused the request" if refused else "raised"
            return error_response(
                400 if refused else 500, f"The model client {what}: {type(exc).__name__}: {exc}"
            )
        if parsed.stream:
            events = stream_events(result, include_usage=parsed.include_usage)
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        return _json(result)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}")

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


def error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> Response:
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return _json({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


# --- responses ----------------------------------------------------------------------------


def completion(
    reply: ModelResponse, request: ChatRequest, *, model: str, tokenizer: Any = None
) -> dict[str, Any]:
    """The ``chat.completion`` object for ``reply``."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    message.update({k: v for k, v in reply.message.items() if k != "role"})
    if message.get("tool_calls"):
        message["tool_calls"] = [_tool_call(i, call) for i, call in enumerate(message["tool_calls"])]
    else:
        message.pop("tool_calls", None)
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None}
    choice["finish_reason"] = reply.finish_reason or ("tool_calls" if message.get("tool_calls") else "stop")
    if request.sampling.logprobs and reply.logprobs is not None:
        choice["logprobs"] = {"content": _logprob_entries(reply, tokenizer)}
    if request.return_token_ids:
        choice["token_ids"] = reply.token_ids
    usage = reply.usage
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        },
    }


def _tool_call(index: int, call: dict[str, Any]) -> dict[str, Any]:
    """A tool call with an id and type; dict arguments encoded as the JSON string OpenAI sends."""
    function = dict(call.get("function") or {})
    if not isinstance(function.get("arguments", ""), str):
        function["arguments"] = orjson.dumps(function["arguments"]).decode()
    return {"id": f"call_{index}", "type": "function", **call, "function": function}


def _logprob_entries(reply: ModelResponse, tokenizer: Any) -> list[dict[str, Any]]:
    assert reply.logprobs is not None
    ids = reply.token_ids if reply.token_ids and len(reply.token_ids) == len(reply.logprobs) else None
    entries = []
    for i, logprob in enumerate(reply.logprobs):
        if ids is None:
            token, raw = "", None
        elif tokenizer is not None:
            token = tokenizer.decode([ids[i]])
            raw = list(token.encode())
        else:
            token, raw = f"token_id:{ids[i]}", None
        entries.append({"token": token, "logprob": logprob, "bytes": raw, "top_logprobs": []})
    return entries


_PIECES = re.compile(r"\S+\s*|\s+")


def stream_events(result: dict[str, Any], *, include_usage: bool = False) -> Iterator[bytes]:
    """A finished ``chat.completion`` replayed as Server-Sent Events of ``chat.completion.chunk``s."""
    choice, message = result["choices"][0], result["choices"][0]["message"]
    head = {"id": result["id"], "object": "chat.completion.chunk", "created": result["created"]}
    head["model"] = result["model"]
    if include_usage:
        head["usage"] = None

    def event(delta: dict[str, Any], **extra: Any) -> bytes:
        chunk = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
        chunk["choices"][0].update(extra)
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    yield event({"role": "assistant", "content": ""})
    if message.get("reasoning_content"):
        yield event({"reasoning_content": message["reasoning_content"]})
    for piece in _PIECES.findall(message.get("content") or ""):
        yield event({"content": piece})
    if message.get("tool_calls"):
        yield event({"tool_calls": [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]})
    last = {"finish_reason": choice["finish_reason"], "logprobs": choice["logprobs"]}
    if "token_ids" in choice:
        last["token_ids"] = choice["token_ids"]
    yield event({}, **last)
    if include_usage:
        yield b"data: " + orjson.dumps({**head, "choices": [], "usage": result["usage"]}) + b"\n\n"
    yield b"data: [DONE]\n\n"


# --- running ------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its host program unless ``signals``."""

    def __init__(self, config: uvicorn.Config, *, signals: bool) -> None:
        super().__init__(config)
        self.signals = signals

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        return super().capture_signals() if self.signals else contextlib.nullcontext()


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one. Raises ``OSError`` if taken."""
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)


def base_url(sock: socket.socket) -> str:
    """``http://HOST:PORT/v1`` for a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"


async def _start(
    app: Starlette, host: str, port: int, *, log_level: str, signals: bool, graceful_timeout: float | None
) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    """Bind, start uvicorn as a task of this loop and wait until it listens."""
    sock = bind(host, port)
    config = uvicorn.Config(
        app, log_level=log_level, lifespan="off", access_log=False, timeout_graceful_shutdown=graceful_timeout
    )
    server = _Server(config, signals=signals)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # raises the startup failure, if any
            raise RuntimeError("the server stopped before it started")
        await asyncio.sleep(0.005)
    return server, task, base_url(sock)


@contextlib.asynccontextmanager
async def running(
    client: ModelClient,
    *,
    model_name: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    log_level: str = "warning",
) -> AsyncIterator[str]:
    """Serve ``client`` from this event loop while the block runs (port 0: a free port).

    Yields the base URL (``http://127.0.0.1:PORT/v1``); on exit, requests still running get
    2 s to finish. Signal handling is left to the host program.
    """
    app = create_app(client, model_name=model_name)
    server, task, url = await _start(app, host, port, log_level=log_level, signals=False, graceful_timeout=2)
    try:
        yield url
    finally:
        server.should_exit = True
        await task


def serve(
    client: ModelClient,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    log_level: str = "warning",
) -> None:
    """Serve ``client`` until SIGINT/SIGTERM, printing ``serving MODEL at URL`` once listening.

    Port 0 picks a free port (the line shows it). Raises ``OSError`` if the address cannot be
    bound (e.g. the port is taken). SIGINT returns once the requests in flight are answered.
    """
    name = model_name or client.model
    app = create_app(client, model_name=name)

    async def main() -> None:
        _, task, url = await _start(app, host, port, log_level=log_level, signals=True, graceful_timeout=None)
        print(f"serving {name} at {url}", flush=True)
        await task

    try:
        import uvloop  # a speed-up where installed (palaestra depends on it except on Windows)
    except ImportError:
        runner: Any = asyncio.run
    else:
        runner = uvloop.run
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it handled
        runner(main())
