"""OpenAIClient: any OpenAI-compatible chat endpoint (OpenAI, OpenRouter, vLLM, llama.cpp server).

Two transports speak the same protocol:
- ``"aiohttp"`` (default): one pooled aiohttp session posting JSON and reading only the fields a
  ``ModelResponse`` needs. It costs a fraction of the SDK's CPU per call (see benchmarks/README.md),
  which matters when hundreds of rollouts share one process.
- ``"openai"``: the official ``openai`` SDK, for servers or features only the SDK handles.

Transient failures (connection errors, 429, 5xx, timeouts) are retried with exponential backoff
and jitter up to ``max_retries`` times, then raised; the engine records them on the rollout.

Token ids and logprobs (what training on the replies needs) are asked for with ``token_ids``:
``True`` always (``return_token_ids`` and ``logprobs``, as vLLM and ``palaestra serve`` take
them), ``False`` never, ``None`` (the default) when ``check()`` found a server known to give them
(one whose ``/models`` says it is ``palaestra`` or ``vllm``); OpenAI's own API refuses the field.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any, Literal
from urllib.parse import urlparse

import aiohttp
import orjson

from palaestra.clients.base import (
    BadResponseError,
    ModelConnectionError,
    ModelHTTPError,
    ModelTimeout,
    TransientModelError,
    http_error,
)
from palaestra.types import Messages, ModelResponse, Sampling, Usage

DEFAULT_BASE_URL = "https://api.openai.com/v1"
TOKEN_ID_SERVERS = {"palaestra", "vllm"}  # /models owned_by values of servers that return token ids
LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
MESSAGE_KEYS = ("role", "content", "tool_calls", "reasoning_content")


class ClientConfigError(ValueError):
    """The client cannot be built as asked (e.g. no API key for a remote endpoint)."""


class OpenAIClient:
    """Chat with ``model`` at ``base_url``. The API key is read from the env var ``api_key_var``.

    A server on loopback needs no key; a remote one without a key is a ``ClientConfigError``
    unless ``api_key=""`` says it needs none. ``max_connections`` should be at least the run's
    ``max_concurrent``. ``extra_body`` fields go into every request body (vLLM's
    ``return_token_ids``: the prompt and completion token ids an RL trainer needs).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key_var: str = "OPENAI_API_KEY",
        api_key: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_connections: int = 256,
        transport: Literal["aiohttp", "openai"] = "aiohttp",
        send_seed: bool = True,
        headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        token_ids: bool | None = None,
    ) -> None:
        if transport not in ("aiohttp", "openai"):
            raise ClientConfigError(f"transport must be 'aiohttp' or 'openai', not {transport!r}")
        self.model = model
        self.token_ids = token_ids  # None: ask when check() finds a server that gives them
        self.completion_tokens = 0  # of every reply so far: what a progress bar shows live
        self._asks_token_ids = bool(token_ids)
        self.base_url = check_base_url(base_url)
        self.api_key_var = api_key_var
        if not timeout > 0 or max_retries < 0:
            raise ClientConfigError(f"need timeout > 0 and max_retries >= 0, got {timeout} and {max_retries}")
        if api_key is None:
            api_key = os.environ.get(api_key_var)
        if api_key is None and urlparse(self.base_url).hostname not in LOOPBACK:
            raise ClientConfigError(
                f"no API key for {self.base_url}: set the environment variable {api_key_var} "
                "(or pass api_key='' for a server that needs none)"
            )
        self.api_key = api_key or ""
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_connections = max_connections
        self.transport = transport
        self.send_seed = send_seed
        self.extra_body = dict(extra_body or {})
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        if self.api_key:
            self.headers["Authorization"] = f"Bearer {self.api_key}"
        self._url = self.base_url + "/chat/completions"
        self._jitter = random.Random()  # retry timing only; never affects results
        self._session: aiohttp.ClientSession | None = None
        self._sdk: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> ModelResponse:
        body = self.request_body(messages, tools, sampling)
        send = self._post_aiohttp if self.transport == "aiohttp" else self._post_sdk
        attempt = 0
        while True:
            try:
                response = parse_completion(await send(body))
                self.completion_tokens += response.usage.completion_tokens
                return response
            except TransientModelError as exc:
                if attempt >= self.max_retries:
                    raise
                await asyncio.sleep(self._delay(attempt, exc))
                attempt += 1

    def request_body(
        self, messages: Messages, tools: list[dict[str, Any]] | None, sampling: Sampling
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
        for key in ("temperature", "top_p", "max_tokens", "stop"):
            value = getattr(sampling, key)
            if value is not None:
                body[key] = value
        if self.send_seed and sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.logprobs or self._asks_token_ids:
            body["logprobs"] = True
        body.update(self.extra_body)
        if self._asks_token_ids:
            body["return_token_ids"] = True
        body.update(sampling.extra)
        return body

    def _delay(self, attempt: int, exc: Exception) -> float:
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            return min(self.max_backoff, retry_after)
        return min(self.max_backoff, self.backoff * 2**attempt) * (0.5 + 0.5 * self._jitter.random())

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (e.g. a second asyncio.run): fresh pools
            self._session, self._sdk, self._loop = None, None, loop

    async def _post_aiohttp(self, body: dict[str, Any]) -> dict[str, Any]:
        self._bind_loop()
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, ttl_dns_cache=300),
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            )
        try:
            async with self._session.post(self._url, data=orjson.dumps(body)) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise _status_error(resp.status, raw, resp.headers.get("Retry-After"))
        except TimeoutError as exc:
            raise ModelTimeout(f"no response within {self.timeout:g}s") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise ModelConnectionError(f"{type(exc).__name__}: {exc}") from exc
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadResponseError(f"response is not JSON: {raw[:200]!r}") from exc

    async def _post_sdk(self, body: dict[str, Any]) -> dict[str, Any]:
        import openai

        self._bind_loop()
        if self._sdk is None:
            self._sdk = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self.api_key or "EMPTY",
                timeout=self.timeout,
                max_retries=0,  # retries are ours, so both transports behave the same
                default_headers={k: v for k, v in self.headers.items() if k != "Authorization"},
            )
        known = {
            "model",
            "messages",
            "tools",
            "temperature",
            "top_p",
            "max_tokens",
            "stop",
            "seed",
            "logprobs",
        }
        args = {k: v for k, v in body.items() if k in known}
        extra = {k: v for k, v in body.items() if k not in known}
        try:
            resp = await self._sdk.chat.completions.create(**args, extra_body=extra or None)
        except openai.APITimeoutError as exc:
            raise ModelTimeout(f"no response within {self.timeout:g}s") from exc
        except openai.APIConnectionError as exc:
            raise ModelConnectionError(str(exc)) from exc
        except openai.APIStatusError as exc:
            raise http_error(exc.status_code, exc.message) from exc
        except (openai.APIResponseValidationError, ValueError) as exc:
            raise BadResponseError(str(exc)) from exc
        return resp.model_dump()

    async def check(self, timeout: float = 10.0) -> None:
        """Fail fast before a run: ``ModelConnectionError`` if the server cannot be reached or does
        not answer within ``timeout``, ``ModelHTTPError`` if it rejects the API key or does not
        list this model among the ones it serves. Servers without ``/models`` pass. A server that
        lists itself as ``palaestra`` or ``vllm`` is asked for token ids from then on (``token_ids=None``)."""
        url = self.base_url + "/models"
        timeout = min(timeout, self.timeout)
        try:
            async with aiohttp.ClientSession(headers=self.headers) as session:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    raw = await resp.read()
                    status = resp.status
        except TimeoutError:
            raise ModelConnectionError(f"{self.base_url} did not answer within {timeout:g}s") from None
        except aiohttp.ClientError as exc:
            reason = str(exc) or type(exc).__name__
            raise ModelConnectionError(f"cannot reach {self.base_url}: {reason}") from None
        if status in (401, 403):
            raise _status_error(status, raw, None)
        if status != 200:
            return  # no model list here (or not at this path): the first requests will tell
        try:
            entries = [m for m in orjson.loads(raw)["data"] if isinstance(m, dict)]
            listed = [m["id"] for m in entries]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        if self.token_ids is None and any(m.get("owned_by") in TOKEN_ID_SERVERS for m in entries):
            self._asks_token_ids = True
        if listed and self.model not in listed:
            shown = ", ".join(listed[:20]) + (f" and {len(listed) - 20} more" if len(listed) > 20 else "")
            raise ModelHTTPError(
                404, f"{self.base_url} does not serve the model {self.model!r}; it serves: {shown}"
            )

    async def aclose(self) -> None:
        """Close the connection pool. The client reopens one if used again."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        if self._sdk is not None:
            await self._sdk.close()
        self._session, self._sdk = None, None

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def check_base_url(url: str) -> str:
    """``url`` without a trailing slash; ``ClientConfigError`` unless it is an http(s) URL with a host."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ClientConfigError(f"the base URL must look like http://HOST:PORT/v1, got {url!r}")
    try:
        parsed.port  # noqa: B018 - parsing the port is the check: it raises for 99999 or "x"
    except ValueError as exc:
        raise ClientConfigError(f"the base URL {url!r} has a bad port: {exc}") from None
    return url.rstrip("/")


def _status_error(status: int, raw: bytes, retry_after: str | None) -> Exception:
    try:
        error = orjson.loads(raw)["error"]
        message = error["message"] if isinstance(error, dict) else str(error)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = raw[:200].decode(errors="replace")
    try:
        seconds = float(retry_after) if retry_after else None
    except ValueError:  # an HTTP date: fall back to our own backoff
        seconds = None
    return http_error(status, message, seconds)


def parse_completion(data: dict[str, Any]) -> ModelResponse:
    """A ``ModelResponse`` from a chat-completion body; token ids from vLLM's fields when present
    (``choices[0].token_ids`` and the top-level ``prompt_token_ids`` of ``return_token_ids``)."""
    try:
        choice = data["choices"][0]
        raw_message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise BadResponseError(f"not a chat completion: {str(data)[:200]}") from exc
    if not isinstance(raw_message, dict):
        raise BadResponseError(f"message is not an object: {str(raw_message)[:200]}")
    message: dict[str, Any] = {"role": "assistant"}
    for key in MESSAGE_KEYS[1:]:
        value = raw_message.get(key)
        if value is not None and value != []:
            message[key] = value
    message.setdefault("content", None)
    usage = data.get("usage") or {}
    token_ids = _ids(choice.get("token_ids"))
    logprobs = None
    content = (choice.get("logprobs") or {}).get("content")
    if content:
        logprobs = [float(t["logprob"]) for t in content]
        if token_ids is None and all(str(t.get("token", "")).startswith("token_id:") for t in content):
            token_ids = [int(t["token"][9:]) for t in content]
    return ModelResponse(
        message=message,
        finish_reason=choice.get("finish_reason"),
        usage=Usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0),
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_token_ids=_ids(data.get("prompt_token_ids")),
    )


def _ids(value: Any) -> list[int] | None:
    """A list of token ids as sent, or None for anything else (absent, null, not integers)."""
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return value
    return None
