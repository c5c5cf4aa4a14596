"""What a broken or hostile MCP server cannot do to a run: keep it waiting on output that is not
MCP, or flood the log.

``guarded(transport, on_violation)`` wraps a transport of the ``mcp`` SDK. The first thing the
server sends that is not a protocol message (a stdout line that is not JSON-RPC, an HTTP body
that is not JSON, a response of another content type) ends the connection as if the server had
closed it: ``on_violation`` gets a one-line description, and whatever waits on the server fails
at once instead of at its timeout. The SDK itself would only log the line and go on reading.
Blank lines between stdio messages are skipped, not held against the server.

``condense_sdk_logs()`` puts a filter on the SDK's loggers: inside a connection's task (where
``log_scope`` is set) each log statement of the SDK gives one line per server, its traceback
folded into that line, and its repeats are dropped. A server writing garbage 1,000 times a
second thus costs one line, not a traceback per line. Records logged elsewhere pass unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LogScope", "condense_sdk_logs", "guarded", "log_scope", "violation"]


@dataclass(eq=False)
class LogScope:
    """One server's log budget: how often each SDK log statement has fired for it."""

    server: str
    seen: Counter[tuple[str, int]] = field(default_factory=Counter)


log_scope: contextvars.ContextVar[LogScope | None] = contextvars.ContextVar("palaestra_mcp_log", default=None)


def one_line(text: str, limit: int = 200) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def violation(item: Any) -> str | None:
    """What is wrong with an item of a transport's read stream, or None for a protocol message.

    The stdio transport hands on a line it cannot parse as an exception; the streamable-HTTP one
    answers the request with a JSON-RPC error of its own making (a parse error, or an
    "Unexpected content type").
    """
    from mcp_types import INVALID_REQUEST, PARSE_ERROR, JSONRPCError

    if isinstance(item, Exception):
        first = _first_error(item)
        if first is not None:  # pydantic's ValidationError: say what the line was
            what = f"{first.get('msg')} ({first.get('input')!r:.80})"
        else:
            what = one_line(f"{type(item).__name__}: {item}")
        return f"it sent something that is not an MCP message: {what}"
    message = getattr(item, "message", None)
    if isinstance(message, JSONRPCError):
        error = message.error
        unexpected = error.code == INVALID_REQUEST and error.message.startswith("Unexpected content type")
        if error.code == PARSE_ERROR or unexpected:
            return f"it sent something that is not an MCP message: {one_line(error.message)}"
    return None


def _first_error(item: Exception) -> dict[str, Any] | None:
    """The first error of a pydantic ``ValidationError`` (how the SDK reports a bad line), or None."""
    errors = getattr(item, "errors", None)
    found = errors() if callable(errors) else None
    return dict(found[0]) if isinstance(found, list) and found and isinstance(found[0], dict) else None


def _skipped(item: Any) -> bool:
    """A blank stdio line: the SDK hands it on as a parse error, but it carries nothing."""
    first = _first_error(item) if isinstance(item, Exception) else None
    text = first.get("input") if first is not None else None
    return isinstance(text, str | bytes) and not text.strip()


class GuardedStream:
    """A transport's read stream that ends at the first item that is not a protocol message."""

    def __init__(self, inner: Any, on_violation: Callable[[str], None]) -> None:
        self._inner = inner
        self._on_violation = on_violation

    @property
    def last_context(self) -> contextvars.Context | None:
        """The sender's context of the last item, where the inner stream keeps one (the SDK reads it)."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        import anyio

        item = await self._inner.receive()
        while _skipped(item):
            item = await self._inner.receive()
        problem = violation(item)
        if problem is None:
            return item
        self._on_violation(problem)
        await self._inner.aclose()
        raise anyio.EndOfStream

    def __aiter__(self) -> GuardedStream:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> GuardedStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def guarded(transport: Any, on_violation: Callable[[str], None]) -> AsyncIterator[tuple[Any, Any]]:
    """``transport`` (an SDK transport context) with its read stream guarded; see the module docstring."""
    async with transport as (read, write):
        yield GuardedStream(read, on_violation), write


class _Condense(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        scope = log_scope.get()
        if scope is None:
            return True
        key = (record.pathname, record.lineno)
        scope.seen[key] += 1
        if scope.seen[key] > 1:
            return False
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record whose arguments do not fit its format
            text = str(record.msg)
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            text += f": {type(error).__name__}: {error}"
        record.msg = "MCP server %r: %s (repeats of this message are not shown)"
        record.args = (scope.server, one_line(text, 300))
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        return True


_FILTER = _Condense()


def condense_sdk_logs() -> None:
    """Put the condensing filter on every ``mcp`` logger there is (again: later imports add some)."""
    manager = logging.Logger.manager
    for name, logger in list(manager.loggerDict.items()):
        if (name == "mcp" or name.startswith("mcp.")) and isinstance(logger, logging.Logger):
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)
