"""One MCP server's connection, held open by an owner task of its own, and tool calls over it.

The SDK's contexts (the transport, the ``mcp.Client``) must be entered and left in one task, so
``own(conn)`` runs as that task: it enters them under ``connect_timeout`` (starting the server,
the handshake and listing the tools all count), sets ``conn.ready``, holds them until
``conn.closing`` is set or the transport fails, and leaves them. ``call(conn, ...)`` uses the
session from any task. The transport's read stream is guarded (``mcp_guard``): a server that
sends something that is not MCP is a dead server, ``MCPProtocolError``, at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from palaestra.envs.mcp_config import MCPServer
from palaestra.envs.mcp_guard import LogScope, condense_sdk_logs, guarded, log_scope

if TYPE_CHECKING:
    import mcp
    from mcp_types import CallToolResult

_generation = itertools.count(1)


class MCPConnectionError(RuntimeError):
    """An MCP server cannot be reached or went away; ends the rollout (stage ``tool``)."""


class MCPProtocolError(MCPConnectionError):
    """An MCP server sent something that is not MCP: its connection is dropped as dead."""


class MCPToolError(RuntimeError):
    """An MCP tool call failed on the server (an ``isError`` result, a protocol error); the model
    reads the message."""


@dataclass(eq=False)
class Connection:
    """One server's live connection, owned by ``task`` (which entered the SDK's contexts)."""

    server: MCPServer
    loop: asyncio.AbstractEventLoop
    logs: LogScope
    generation: int = field(default_factory=lambda: next(_generation))
    ready: asyncio.Future[None] = field(init=False)
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    scope: Any = None  # the owner's anyio.CancelScope: cancelled to force the connection down
    client: mcp.Client | None = None
    tools: list[Any] = field(default_factory=list)
    error: BaseException | None = None
    dead: bool = False
    registered: bool = False  # its tools are in the env's tool_map

    def __post_init__(self) -> None:
        self.ready = self.loop.create_future()
        # the outcome is read by whoever connects; a waiter that was cancelled must not leave
        # an unretrieved exception behind
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())

    def usable(self) -> bool:
        return (
            not self.dead
            and self.ready.done()
            and not self.ready.cancelled()
            and self.ready.exception() is None
            and self.task is not None
            and not self.task.done()
            and not _peer_closed(self.client)
        )

    def why(self) -> str:
        """The cause of a lost connection, for messages."""
        error = self.error
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]
        return f": {type(error).__name__}: {error}" if error is not None else ""

    def broke_protocol(self, problem: str) -> None:
        """The server sent something that is not MCP: the connection is dead from now on."""
        if self.error is None:
            self.error = MCPProtocolError(problem)
        self.dead = True
        self.closing.set()


async def own(conn: Connection) -> None:
    """The connection's owner task: enter the SDK's contexts, list the tools, hold them open
    until ``closing`` is set (or the transport fails), then leave them, all in this task."""
    import anyio
    from mcp import Client

    server = conn.server
    log_scope.set(conn.logs)  # the SDK's tasks for this connection start from this context
    condense_sdk_logs()
    try:
        with anyio.CancelScope(deadline=anyio.current_time() + server.connect_timeout) as scope:
            conn.scope = scope
            async with contextlib.AsyncExitStack() as stack:
                target = guarded(await _transport(server, stack), conn.broke_protocol)
                client = await stack.enter_async_context(Client(target, cache=None))
                conn.tools = await _list_tools(client)
                conn.client = client
                scope.deadline = math.inf
                conn.ready.set_result(None)
                await conn.closing.wait()
        if scope.cancelled_caught and not conn.ready.done() and conn.error is None:
            why = "closed while connecting" if conn.closing.is_set() else "timed out"
            raise TimeoutError(f"{why} after {server.connect_timeout:g} s")
    except Exception as exc:  # noqa: BLE001 - kept for the messages; the connection is dead
        if conn.error is None:  # a protocol violation is the cause of what failed after it
            conn.error = exc
    finally:
        conn.dead = True
        if not conn.ready.done():
            conn.ready.set_exception(MCPConnectionError(f"MCP server {server.name!r}{conn.why()}"))


async def call(conn: Connection, tool: str, arguments: dict[str, Any]) -> str:
    """Call ``tool`` over ``conn``; its result as text. ``MCPToolError`` for an ``isError`` result
    or a protocol error, ``MCPConnectionError`` when the connection is gone (it is then dead)."""
    assert conn.client is not None and conn.task is not None
    token = log_scope.set(conn.logs)  # the request's task (over HTTP, its POST too) logs for this server
    try:
        request = asyncio.ensure_future(conn.client.call_tool(tool, arguments))
    finally:
        log_scope.reset(token)
    try:
        await asyncio.wait({request, conn.task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not request.done():  # cancelled (a timeout), or the connection ended first
            request.cancel()
            await asyncio.wait({request}, timeout=1.0)
    where = f"MCP server {conn.server.name!r} ({describe(conn.server)})"
    torn = not request.done() or request.cancelled()  # the transport failed and tore the call down
    exc = None if torn else request.exception()
    if (torn or exc is not None) and isinstance(conn.error, MCPProtocolError):
        conn.dead = True
        raise MCPProtocolError(f"{where} is dropped: {conn.error}") from exc
    if torn:
        conn.dead = True
        raise MCPConnectionError(f"{where} closed the connection{conn.why()}")
    if exc is not None:
        if _connection_lost(exc):
            conn.dead = True
            raise MCPConnectionError(f"{where} closed the connection: {type(exc).__name__}: {exc}") from exc
        if _is_mcp_error(exc):
            raise MCPToolError(str(getattr(exc, "message", exc))) from exc
        raise exc
    result = request.result()
    text = result_text(result)
    if result.is_error:
        raise MCPToolError(text or "the tool reported an error")
    return text


def result_text(result: CallToolResult) -> str:
    """A ``CallToolResult`` as a tool message: text parts as they are, others as placeholders
    (an image's or a blob's bytes never reach the model), joined by newlines; the structured
    content as JSON when there is no content."""
    parts = []
    for block in result.content:
        kind = getattr(block, "type", "?")
        if kind == "text":
            parts.append(block.text)  # type: ignore[union-attr]  # a text block, by its type
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '?')!s:.100}]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {getattr(block, 'uri', '?')!s:.300}]")
        elif kind == "resource":
            resource = getattr(block, "resource", None)
            text = getattr(resource, "text", None)
            if isinstance(text, str):
                parts.append(text)
            else:
                mime = getattr(resource, "mime_type", None) or "binary"
                parts.append(f"[resource: {getattr(resource, 'uri', '?')!s:.300} ({mime!s:.100})]")
        else:
            parts.append(f"[{kind!s:.100} content]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


def describe(server: MCPServer) -> str:
    """The server's URL or command line, for messages."""
    if server.url is not None:
        return server.url
    return " ".join([str(server.command), *server.args])[:120]


def _peer_closed(client: Any) -> bool:
    """Whether the SDK saw the server close the connection (a stdio server that exited while
    idle); best effort, through private attributes: False when they are not there."""
    try:
        return bool(client.session._dispatcher._closed)
    except Exception:  # noqa: BLE001 - another SDK version: no early detection, calls still fail
        return False


async def _transport(server: MCPServer, stack: contextlib.AsyncExitStack) -> Any:
    """The SDK transport for ``server``: stdio, or streamable HTTP over an HTTP client (with the
    headers) that ``stack`` closes."""
    if server.command is not None:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        return stdio_client(
            StdioServerParameters(
                command=server.command,
                args=list(server.args),
                env=dict(server.env) if server.env is not None else None,
                cwd=server.cwd,
            )
        )
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    assert server.url is not None
    timeout = httpx2.Timeout(30.0, connect=server.connect_timeout, read=max(300.0, server.timeout + 5))
    http = await stack.enter_async_context(
        httpx2.AsyncClient(headers=dict(server.headers or {}), timeout=timeout)
    )
    return streamable_http_client(server.url, http_client=http)


async def _list_tools(client: mcp.Client) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(1000):  # a paginator that never ends must not hang the connection
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _is_mcp_error(exc: BaseException) -> bool:
    from mcp import MCPError

    return isinstance(exc, MCPError)


def _connection_lost(exc: BaseException) -> bool:
    """Whether a call's exception means the connection is gone (not the tool's failure)."""
    import anyio
    import httpx2
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(exc, MCPError):
        return exc.code == CONNECTION_CLOSED
    lost = (
        OSError,
        EOFError,
        httpx2.TransportError,
        anyio.BrokenResourceError,
        anyio.ClosedResourceError,
        anyio.EndOfStream,
    )
    if isinstance(exc, BaseExceptionGroup):
        return any(_connection_lost(e) for e in exc.exceptions)
    return isinstance(exc, lost)


def require_mcp() -> None:
    """Raise ``ImportError`` saying what to install unless the ``mcp`` SDK 2.x is there."""
    try:
        import mcp
    except ImportError as exc:
        raise ImportError("MCPEnv needs the MCP SDK: pip install 'palaestra[mcp]' (mcp 2.x)") from exc
    if not hasattr(mcp, "Client"):
        version = getattr(sys.modules.get("mcp"), "__version__", "1.x")
        raise ImportError(f"MCPEnv needs mcp 2.x (its mcp.Client); this is mcp {version}")
