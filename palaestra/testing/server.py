"""A fake OpenAI-compatible chat server on a real HTTP stack, for tests and benchmarks.

``FakeOpenAIServer`` answers ``POST /v1/chat/completions`` and ``GET /v1/models`` with
OpenAI-shaped JSON, from a reply function you give it (default: echo the last user message).
It can inject faults (HTTP errors, hangs, dropped connections, broken bodies) from the reply
function or from a deterministic ``FaultPlan``, so retry and timeout code is tested against real
sockets. Run ``python -m palaestra.testing.server --port 0`` for a standalone process that
prints ``READY <base_url>`` once it listens.

A fault directive is a dict ``{"fault": KIND, ...}``, returned by the reply function or listed in
a ``FaultPlan``. ``"status"``: an OpenAI error with ``"status"`` (default 500), optional
``"retry_after"`` (seconds, sent as Retry-After) and ``"message"``. ``"hang"``: wait
``"seconds"`` then answer normally (default: until ``stop()``, which drops the connection).
``"close"``: drop the connection with no response. ``"malformed"``: 200 with a broken JSON body.
``"bad_shape"``: 200 with JSON lacking ``choices``. Any directive may carry ``"attempts": N``
(fire only for the first N requests of each distinct message list) and ``"reply"`` (what a
reply-function directive answers once it no longer fires; default: echo).

Tokens are whitespace-split words: a crude, deterministic count used for ``usage``,
``max_tokens`` truncation and fake ``logprobs`` / ``token_ids`` (vLLM's field).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import inspect
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

Reply = str | dict[str, Any]
"""A str is the assistant content; a dict is a full assistant message or a fault directive."""
ReplyFn = Callable[[dict[str, Any]], Reply | Awaitable[Reply]]
"""Gets the parsed request body (``model``, ``messages``, ...) and returns a ``Reply``."""

FAULT_KINDS = ("status", "hang", "close", "malformed", "bad_shape")
VOCAB_SIZE = 50_000
_JSON = "application/json"


@dataclass(frozen=True)
class FaultPlan:
    """A deterministic fault schedule: request ``i`` (0-based, server-wide) gets ``faults[i % n]``.

    ``None`` entries mean a normal reply. With ``cycle=False`` every request after the sequence
    is normal. E.g. ``FaultPlan([None, None, {"fault": "status", "status": 500}])`` fails every
    third request; ``FaultPlan([{"fault": "status", "status": 500, "attempts": 2}])`` fails the
    first two attempts of every distinct conversation.
    """

    faults: Sequence[dict[str, Any] | None]
    cycle: bool = True

    def __post_init__(self) -> None:
        if not self.faults:
            raise ValueError("FaultPlan needs at least one entry (use None for a normal reply)")
        for directive in self.faults:
            if directive is not None and directive.get("fault") not in FAULT_KINDS:
                raise ValueError(f"unknown fault kind {directive.get('fault')!r}: {FAULT_KINDS}")

    def fault_for(self, index: int) -> dict[str, Any] | None:
        """The directive for request number ``index``, or None for a normal reply."""
        if index >= len(self.faults) and not self.cycle:
            return None
        return self.faults[index % len(self.faults)]


class FakeOpenAIServer:
    """An OpenAI-compatible chat server on loopback; ``base_url`` is set once started.

    ``requests`` keeps every accepted request body in order (turn off with
    ``record_requests=False`` for long benchmarks); ``request_count`` counts them either way.
    ``attempts`` counts, per hash of a message list, the requests that met a directive carrying
    ``"attempts"``. Only one choice is returned, whatever ``n`` asks; streaming gets a 400.
    """

    def __init__(
        self,
        reply: ReplyFn | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "fake-model",
        faults: FaultPlan | None = None,
        api_key: str | None = None,
        record_requests: bool = True,
    ) -> None:
        self.reply: ReplyFn = reply if reply is not None else echo_reply
        self.host = host
        self.port = port
        self.model = model
        self.faults = faults
        self.api_key = api_key
        self.record_requests = record_requests
        self.requests: list[dict[str, Any]] = []
        self.request_count = 0
        self.attempts: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        entry = {"id": model, "object": "model", "created": 0, "owned_by": "palaestra"}
        self._models_body = orjson.dumps({"object": "list", "data": [entry]})

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``; only valid after ``start()``."""
        if self._runner is None:
            raise RuntimeError("FakeOpenAIServer is not started")
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> None:
        """Bind and listen; with ``port=0`` the OS picks a free port (read it from ``port``)."""
        if self._runner is not None:
            raise RuntimeError("FakeOpenAIServer is already started")
        app = web.Application(client_max_size=64 * 1024 * 1024)
        if self.api_key is not None:
            app.middlewares.append(_require_key(f"Bearer {self.api_key}"))
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port).start()
        self.port = runner.addresses[0][1]
        self._stopping = asyncio.Event()
        self._runner = runner

    async def stop(self) -> None:
        """Stop listening, drop hung requests and close every connection."""
        if self._runner is None:
            return
        assert self._stopping is not None
        self._stopping.set()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> FakeOpenAIServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # --- handlers -------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        return web.Response(body=self._models_body, content_type=_JSON)

    async def _chat(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return error_response(400, "We could not parse the JSON body of your request.")
        if (rejected := self._reject(body)) is not None:
            return rejected
        index = self.request_count
        self.request_count += 1
        if self.record_requests:
            self.requests.append(body)

        planned = self.faults.fault_for(index) if self.faults is not None else None
        if planned is not None and self._applies(planned, body):
            if (faulted := await self._fault(request, planned)) is not None:
                return faulted
        try:
            reply = self.reply(body)
            if inspect.isawaitable(reply):
                reply = await reply
        except Exception as exc:  # noqa: BLE001 -- any bug in user code goes back as a 500
            return error_response(500, f"reply function raised {type(exc).__name__}: {exc}")
        if isinstance(reply, dict) and "fault" in reply:
            if reply["fault"] not in FAULT_KINDS:
                return error_response(500, f"unknown fault kind {reply['fault']!r}")
            if self._applies(reply, body):
                if (faulted := await self._fault(request, reply)) is not None:
                    return faulted
            reply = reply["reply"] if reply.get("reply") is not None else echo_reply(body)
        return web.Response(body=orjson.dumps(completion(body, reply, index)), content_type=_JSON)

    def _reject(self, body: Any) -> web.Response | None:
        """The 400/404 error for a body this server will not answer, or None."""
        if not isinstance(body, dict):
            return error_response(400, "The request body must be a JSON object.")
        if not isinstance(body.get("model"), str):
            return error_response(400, "You must provide a model (a string).", param="model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            msg = "'messages' must be a non-empty list of message objects."
            return error_response(400, msg, param="messages")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            msg = "Each message must be an object with a string 'role'."
            return error_response(400, msg, param="messages")
        if body["model"] != self.model:
            msg = f"The model `{body['model']}` does not exist or you do not have access to it."
            return error_response(404, msg, param="model", code="model_not_found")
        if body.get("stream"):
            msg = "Streaming is not supported by the palaestra fake server; send stream=false."
            return error_response(400, msg, param="stream", code="unsupported_value")
        return None

    def _applies(self, directive: dict[str, Any], body: dict[str, Any]) -> bool:
        """Whether a directive fires: always, or for the first ``attempts`` tries of a chat."""
        limit = directive.get("attempts")
        if limit is None:
            return True
        key = messages_key(body["messages"])
        seen = self.attempts.get(key, 0)
        self.attempts[key] = seen + 1
        return seen < limit

    async def _fault(self, request: web.Request, directive: dict[str, Any]) -> web.Response | None:
        """Carry out a fault; None means "now answer normally" (a hang that ran its course)."""
        kind = directive["fault"]
        if kind == "status":
            status = int(directive.get("status", 500))
            retry_after = directive.get("retry_after")
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
            msg = directive.get("message", f"Injected fault: HTTP {status}.")
            return error_response(status, msg, headers=headers)
        if kind == "malformed":
            return web.Response(body=b'{"id": "chatcmpl-broken", "choi', content_type=_JSON)
        if kind == "bad_shape":
            shape = {"id": "chatcmpl-bad", "object": "chat.completion", "model": self.model}
            return web.Response(body=orjson.dumps(shape), content_type=_JSON)
        if kind == "hang":
            assert self._stopping is not None
            try:
                await asyncio.wait_for(self._stopping.wait(), directive.get("seconds"))
            except TimeoutError:
                return None
        # "close", or a hang cut short by stop(): drop the connection without a response.
        # The response below is never sent: aiohttp fails to write it to the closed transport
        # and takes that for a client disconnect (nothing is logged).
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=500)


# --- response building ---------------------------------------------------------------------


def _require_key(expected: str) -> Middleware:
    """Middleware answering 401 to requests without ``Authorization: <expected>``."""

    @web.middleware
    async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.headers.get("Authorization") == expected:
            return await handler(request)
        msg = "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'."
        return error_response(401, msg, code="invalid_api_key")

    return require_key


_ERROR_TYPES = {401: "authentication_error", 404: "invalid_request_error", 429: "rate_limit_error"}


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    payload = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    body = orjson.dumps(payload)
    return web.Response(status=status, body=body, content_type=_JSON, headers=headers)


def completion(body: dict[str, Any], reply: Reply, index: int = 0) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` object answering ``body`` with ``reply``.

    Reply tokens are the content's words, then each tool call's name and argument words. Past
    ``max_tokens`` (or ``max_completion_tokens``) the content is cut to that many words, tool
    calls are dropped and ``finish_reason`` is ``"length"``.
    """
    message = _assistant_message(reply)
    content = message.get("content")
    content_words = content.split() if isinstance(content, str) else []
    words = list(content_words)
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        words.append(str(function.get("name", "")))
        words.extend(str(function.get("arguments", "")).split())
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(limit, int) and len(words) > limit:
        words = content_words[:limit]
        message["content"] = " ".join(words)
        message.pop("tool_calls", None)
        finish = "length"

    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    choice["logprobs"] = None
    want_ids = body.get("return_token_ids")
    if body.get("logprobs") or want_ids:
        tokens = [token_info(w) for w in words]
        choice["token_ids"] = [t for t, _ in tokens]
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in tokens
                ]
            }
    prompt_words = [w for m in body["messages"] for w in _text(m.get("content")).split()]
    result: dict[str, Any] = {
        "id": f"chatcmpl-fake-{index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body["model"],
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt_words),
            "completion_tokens": len(words),
            "total_tokens": len(prompt_words) + len(words),
        },
    }
    if want_ids:
        result["prompt_token_ids"] = [token_info(w)[0] for w in prompt_words]
    return result


def _assistant_message(reply: Reply) -> dict[str, Any]:
    if isinstance(reply, str):
        return {"role": "assistant", "content": reply}
    message: dict[str, Any] = {"role": "assistant", "content": None, **reply}
    if message.get("tool_calls"):  # fill in ids and types, encode dict arguments as JSON
        message["tool_calls"] = [_tool_call(i, c) for i, c in enumerate(message["tool_calls"])]
    return message


def _tool_call(i: int, call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function", {}))
    if not isinstance(function.get("arguments", ""), str):
        function["arguments"] = orjson.dumps(function["arguments"]).decode()
    return {"id": f"call_{i}", "type": "function", **call, "function": function}


@lru_cache(maxsize=65_536)
def token_info(word: str) -> tuple[int, float]:
    """(token id, logprob) of a word: stable across runs, id < 50000, logprob in [-5, -0.005]."""
    h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
    return h % VOCAB_SIZE, -((h >> 20) % 1000 + 1) / 200


def messages_key(messages: list[dict[str, Any]]) -> str:
    """A stable hash of a message list: retries of one conversation share it."""
    raw = orjson.dumps(messages, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(raw, digest_size=12).hexdigest()


def _text(content: Any) -> str:
    """The text of a message content: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


# --- built-in replies ------------------------------------------------------------------------


def echo_reply(body: dict[str, Any]) -> str:
    """The default reply: the text of the last user message ("" if there is none)."""
    for message in reversed(body.get("messages", ())):
        if message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def reverse_reply(body: dict[str, Any]) -> str:
    """The last user message reversed, inside ``<reversed_text>`` tags."""
    return f"<reversed_text>{echo_reply(body)[::-1]}</reversed_text>"


def fixed_reply(text: str) -> ReplyFn:
    """A reply function that always answers ``text``."""
    return lambda body: text


# --- standalone process ----------------------------------------------------------------------


def _reply_from_spec(spec: str) -> ReplyFn:
    if spec in ("echo", "reverse"):
        return echo_reply if spec == "echo" else reverse_reply
    if spec.startswith("fixed:"):
        return fixed_reply(spec.removeprefix("fixed:"))
    raise argparse.ArgumentTypeError(f"unknown reply {spec!r}: use echo, reverse or fixed:TEXT")


async def _serve(args: argparse.Namespace) -> None:
    options = {"host": args.host, "port": args.port, "model": args.model, "api_key": args.api_key}
    server = FakeOpenAIServer(args.reply, record_requests=False, **options)
    await server.start()
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    print(f"READY {server.base_url}", flush=True)
    try:
        await done.wait()
    finally:
        await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; print ``READY <base_url>`` once listening. Returns 0."""
    parser = argparse.ArgumentParser(
        prog="python -m palaestra.testing.server", description="Fake OpenAI chat server."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    reply_help = "echo | reverse | fixed:TEXT"
    parser.add_argument("--reply", type=_reply_from_spec, default="echo", help=reply_help)
    args = parser.parse_args(argv)
    try:
        import uvloop  # a speed-up where installed (palaestra depends on it except on Windows)
    except ImportError:
        asyncio.run(_serve(args))
    else:
        uvloop.run(_serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
