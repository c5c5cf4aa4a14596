"""A fake OpenAI-compatible chat server for tests and benchmarks: the real server, scripted.

``FakeOpenAIServer`` is ``palaestra serve``'s app (``palaestra.serve.create_app``) over a
``ReplyClient`` — a model whose answer is a reply function of the request body (default: echo the
last user message) — plus a middleware that injects faults. So tests of clients exercise the
server code users run, on real sockets. Run ``python -m palaestra.testing.server --port 0`` for a
standalone process that prints ``READY <base_url>`` once it listens.

A fault directive is a dict ``{"fault": KIND, ...}``, returned by the reply function or listed in
a ``FaultPlan``. ``"status"``: an OpenAI error with ``"status"`` (default 500), optional
``"retry_after"`` (seconds, sent as Retry-After) and ``"message"``. ``"hang"``: wait
``"seconds"`` then answer normally (default: until ``stop()``, which drops the connection).
``"close"``: drop the connection with no response. ``"malformed"``: 200 with a broken JSON body.
``"bad_shape"``: 200 with JSON lacking ``choices``. Any directive may carry ``"attempts": N``
(fire only for the first N requests of each distinct message list) and ``"reply"`` (what a
reply-function directive answers once it no longer fires; default: echo). Faults apply to
requests without ``stream: true``.

Tokens are whitespace-split words: a crude, deterministic count used for ``usage``,
``max_tokens`` truncation and fake ``logprobs`` / token ids.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import inspect
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from palaestra.openai_api import tool_call
from palaestra.runner import run_async
from palaestra.serve import create_app, error_response, start
from palaestra.types import Messages, ModelResponse, Sampling, Usage, content_text

Reply = str | dict[str, Any]
"""A str is the assistant content; a dict is a full assistant message or a fault directive."""
ReplyFn = Callable[[dict[str, Any]], Reply | Awaitable[Reply]]
"""Gets the parsed request body (``model``, ``messages``, ...) and returns a ``Reply``."""

FAULT_KINDS = ("status", "hang", "close", "malformed", "bad_shape")
VOCAB_SIZE = 50_000

# per request, set by the fault middleware: the raw body, and the fault the reply asked for
_body: ContextVar[dict[str, Any]] = ContextVar("palaestra_fake_body")
_fault: ContextVar[list[dict[str, Any]]] = ContextVar("palaestra_fake_fault")


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
    ``"attempts"``.
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
        app = create_app(
            ReplyClient(self),
            api_key=self.api_key,
            max_body_bytes=64 * 1024 * 1024,
            middlewares=[self._inject_faults],
        )
        self._stopping = asyncio.Event()
        self._runner, url = await start(app, self.host, self.port, grace=0.1)
        self.port = int(url.rsplit(":", 1)[1].split("/")[0])

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

    # --- faults ---------------------------------------------------------------------------

    @web.middleware
    async def _inject_faults(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Hand the raw body to the ``ReplyClient``; carry out any fault it asked for."""
        if request.method != "POST":
            return await handler(request)
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return await handler(request)  # the app answers it with a 400
        box: list[dict[str, Any]] = []
        _body.set(body if isinstance(body, dict) else {})
        _fault.set(box)
        response = await handler(request)
        if not box:
            return response
        return await self._fault(request, box[0])

    def applies(self, directive: dict[str, Any], messages: Messages) -> bool:
        """Whether a directive fires: always, or for the first ``attempts`` tries of a chat."""
        limit = directive.get("attempts")
        if limit is None:
            return True
        key = messages_key(messages)
        seen = self.attempts.get(key, 0)
        self.attempts[key] = seen + 1
        return seen < limit

    async def hang(self, seconds: float | None) -> bool:
        """Wait ``seconds`` (None: until ``stop()``); whether the server stopped meanwhile."""
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _fault(self, request: web.Request, directive: dict[str, Any]) -> web.StreamResponse:
        kind = directive["fault"]
        if kind == "status":
            status = int(directive.get("status", 500))
            retry_after = directive.get("retry_after")
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
            msg = directive.get("message", f"Injected fault: HTTP {status}.")
            return error_response(status, msg, headers=headers)
        if kind == "malformed":
            return web.Response(body=b'{"id": "chatcmpl-broken", "choi', content_type="application/json")
        if kind == "bad_shape":
            shape = {"id": "chatcmpl-bad", "object": "chat.completion", "model": self.model}
            return web.Response(body=orjson.dumps(shape), content_type="application/json")
        # "close", or a hang cut short by stop(): drop the connection without a response. The
        # response below is never sent: aiohttp fails to write it to the closed transport.
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=500)


class ReplyClient:
    """The model behind a ``FakeOpenAIServer``: its reply function, answered word by word."""

    def __init__(self, server: FakeOpenAIServer) -> None:
        self.server = server
        self.model = server.model

    async def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> ModelResponse:
        server, body = self.server, _body.get()
        index = server.request_count
        server.request_count += 1
        if server.record_requests:
            server.requests.append(body)
        planned = server.faults.fault_for(index) if server.faults is not None else None
        if planned is not None and server.applies(planned, messages):
            if (early := await self._fault(planned)) is not None:
                return early
        reply = server.reply(body)
        if inspect.isawaitable(reply):
            reply = await reply
        if isinstance(reply, dict) and "fault" in reply:
            if reply["fault"] not in FAULT_KINDS:
                raise RuntimeError(f"unknown fault kind {reply['fault']!r}")
            if server.applies(reply, messages) and (early := await self._fault(reply)) is not None:
                return early
            reply = reply["reply"] if reply.get("reply") is not None else echo_reply(body)
        return word_response(reply, messages, sampling.max_tokens)

    async def _fault(self, directive: dict[str, Any]) -> ModelResponse | None:
        """Note the fault for the middleware; None when it has run its course (a finished hang)."""
        if _body.get().get("stream"):
            raise RuntimeError("the fake server injects faults into requests without stream: true only")
        if directive["fault"] == "hang" and not await self.server.hang(directive.get("seconds")):
            return None
        _fault.get().append(directive)
        return ModelResponse({"role": "assistant", "content": ""})


def word_response(reply: Reply, messages: Messages, max_tokens: int | None) -> ModelResponse:
    """``reply`` as a model response whose tokens are words.

    Reply tokens are the content's words, then each tool call's name and argument words. Past
    ``max_tokens`` the content is cut to that many words, tool calls are dropped and the finish
    reason is ``"length"``.
    """
    message: dict[str, Any] = (
        {"role": "assistant", "content": reply} if isinstance(reply, str) else {"role": "assistant", **reply}
    )
    if message.get("tool_calls"):
        message["tool_calls"] = [tool_call(i, c) for i, c in enumerate(message["tool_calls"])]
    content = message.get("content")
    content_words = content.split() if isinstance(content, str) else []
    words = list(content_words)
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        words.append(str(function.get("name", "")))
        words.extend(str(function.get("arguments", "")).split())
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    if max_tokens is not None and len(words) > max_tokens:
        words = content_words[:max_tokens]
        message["content"] = " ".join(words)
        message.pop("tool_calls", None)
        finish = "length"
    prompt = [w for m in messages for w in content_text(m.get("content")).split()]
    tokens = [token_info(w) for w in words]
    return ModelResponse(
        message=message,
        finish_reason=finish,
        usage=Usage(prompt_tokens=len(prompt), completion_tokens=len(words)),
        token_ids=[t for t, _ in tokens],
        logprobs=[lp for _, lp in tokens],
        prompt_token_ids=[token_info(w)[0] for w in prompt],
    )


@lru_cache(maxsize=65_536)
def token_info(word: str) -> tuple[int, float]:
    """(token id, logprob) of a word: stable across runs, id < 50000, logprob in [-5, -0.005]."""
    h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
    return h % VOCAB_SIZE, -((h >> 20) % 1000 + 1) / 200


def messages_key(messages: list[dict[str, Any]]) -> str:
    """A stable hash of a message list: retries of one conversation share it."""
    raw = orjson.dumps(messages, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(raw, digest_size=12).hexdigest()


# --- built-in replies ------------------------------------------------------------------------


@contextlib.contextmanager
def served_in_thread(*args: Any, **kwargs: Any) -> Iterator[FakeOpenAIServer]:
    """A ``FakeOpenAIServer(*args, **kwargs)`` on an event loop of its own thread, for code under
    test that runs its own loop on the main thread (``palaestra.cli.main``, say)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = FakeOpenAIServer(*args, **kwargs)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def echo_reply(body: dict[str, Any]) -> str:
    """The default reply: the text of the last user message ("" if there is none)."""
    for message in reversed(body.get("messages", ())):
        if message.get("role") == "user":
            return content_text(message.get("content"))
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
    run_async(_serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
