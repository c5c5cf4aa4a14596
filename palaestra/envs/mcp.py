"""MCPEnv: the tools of Model Context Protocol servers, called by the model like any ``ToolEnv`` tool.

Each server is an ``MCPServer``: a command run over stdio, or a streamable-HTTP URL. The env
connects lazily, inside the running event loop: at the start of the first rollout (or on
``await env.connect()``, for the tool list up front), to every server at once. Each MCP tool
becomes a ``Tool`` whose ``parameters`` are the server's ``inputSchema`` unchanged; the server
checks the arguments. Tool names are the server's, or ``<server>_<tool>`` when ``prefix_tools``
is true (by default: when there is more than one server), characters the OpenAI API refuses
replaced by ``_``. Two tools with one name are refused at connection time.

A result's text parts are the tool message; other parts read as placeholders (``[image:
image/png]``). A result with ``isError`` set, or an MCP protocol error, is an ``Error: ...`` for
the model (counted in ``tool_errors``). A server that goes away mid-rollout (its process killed,
its HTTP server gone) ends that rollout with an ``MCPConnectionError``, stage ``tool``, naming
the server; the dead connection is dropped and the next rollout reconnects. A rollout that
began on a connection which was replaced meanwhile fails the same way: the server's session
state it relied on is gone.

Each connection lives in a background task of its own (the SDK's contexts must be entered and
left in one task); tool calls use its session from any task. ``aclose()`` ends them all: stdio
servers get their stdin closed, then SIGTERM/SIGKILL (the SDK's shutdown), HTTP sessions are
terminated. The env stays usable after it and reconnects on demand. Needs ``pip install
'palaestra[mcp]'`` (the ``mcp`` SDK, 2.x).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from palaestra.envs.multiturn import EpisodeError
from palaestra.envs.tool import ToolEnv
from palaestra.tools import NAME, Tool
from palaestra.types import ErrorInfo, Messages, State

if TYPE_CHECKING:
    import mcp
    from mcp_types import CallToolResult

__all__ = ["MCPConnectionError", "MCPEnv", "MCPServer", "MCPToolError"]

_INVALID = re.compile(r"[^a-zA-Z0-9_-]")
_GENERATIONS = "mcp_connections"  # state.resources key: server name -> connection generation
_ROLLOUT: contextvars.ContextVar[State] = contextvars.ContextVar("palaestra_mcp_rollout")
_generation = itertools.count(1)


class MCPConnectionError(RuntimeError):
    """An MCP server cannot be reached or went away; ends the rollout (stage ``tool``)."""


class MCPToolError(RuntimeError):
    """An MCP tool call failed on the server (an ``isError`` result, a protocol error); the model
    reads the message."""


@dataclass(frozen=True)
class MCPServer:
    """One MCP server: ``command`` (+ ``args``, ``env``, ``cwd``) over stdio, or ``url`` (+
    ``headers``) over streamable HTTP; exactly one of the two.

    ``env`` is merged over the SDK's minimal default environment (PATH, HOME, ...), not over
    ``os.environ``. ``timeout`` bounds each tool call (seconds), ``connect_timeout`` starting
    the server, the handshake and listing its tools. ``name`` (letters, digits, ``_``, ``-``)
    names the server in errors and in prefixed tool names.
    """

    name: str
    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    timeout: float = 60.0
    connect_timeout: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise ValueError(f"MCP server name {self.name!r} must match {NAME.pattern}")
        where = f"MCP server {self.name!r}"
        if (self.command is None) == (self.url is None):
            raise ValueError(f"{where}: give exactly one of command (stdio) or url (streamable HTTP)")
        if isinstance(self.args, str):
            raise ValueError(f"{where}: args must be a list of strings, not one string")
        object.__setattr__(self, "args", tuple(str(a) for a in self.args))
        for key in ("env", "headers"):
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, {str(k): str(v) for k, v in dict(value).items()})
        if self.url is not None:
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(f"{where}: url must start with http:// or https://, got {self.url!r}")
            if self.args or self.env is not None or self.cwd is not None:
                raise ValueError(f"{where}: args, env and cwd are for a command, not a url")
        elif self.headers is not None:
            raise ValueError(f"{where}: headers are for a url, not a command")
        for key in ("timeout", "connect_timeout"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{where}: {key} must be a positive number of seconds, got {value!r}")

    @property
    def transport(self) -> str:
        """``"stdio"`` or ``"http"``."""
        return "stdio" if self.command is not None else "http"

    @classmethod
    def from_dict(cls, name: str, spec: Mapping[str, Any]) -> MCPServer:
        """A server from an ``mcpServers``-style entry: ``{"command", "args", "env", "cwd"}`` or
        ``{"url", "headers"}``, plus ``timeout``/``connect_timeout``; a ``type``/``transport`` of
        ``stdio``, ``http``, ``streamable-http`` or ``streamableHttp`` is checked and dropped."""
        options = dict(spec)
        options.pop("name", None)
        kind = options.pop("type", None) or options.pop("transport", None)
        if kind is not None:
            kind = str(kind).lower().replace("_", "-")
            if kind not in ("stdio", "http", "streamable-http", "streamablehttp"):
                raise ValueError(f"MCP server {name!r}: transport {kind!r} is not supported (stdio or http)")
            if (kind == "stdio") != ("command" in options):
                raise ValueError(f"MCP server {name!r}: type {kind!r} does not fit its command/url")
        known = {f for f in cls.__dataclass_fields__ if f != "name"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"MCP server {name!r}: unknown keys {unknown} (known: {sorted(known)})")
        return cls(name=name, **options)


def parse_servers(servers: Any) -> tuple[MCPServer, ...]:
    """``MCPServer``s from what ``MCPEnv(servers=...)`` takes: one server, a list of servers or
    dicts with a ``name``, or a mapping name -> dict (optionally wrapped in ``{"mcpServers": ...}``)."""
    if isinstance(servers, MCPServer):
        return (servers,)
    if isinstance(servers, Mapping):
        if "mcpServers" in servers:
            servers = servers["mcpServers"]
        items: Iterable[Any] = (
            s if isinstance(s, MCPServer) else MCPServer.from_dict(str(name), s)
            for name, s in servers.items()
        )
    elif isinstance(servers, Iterable) and not isinstance(servers, str | bytes):
        items = (_one_server(s) for s in servers)
    else:
        raise TypeError(
            f"servers must be MCPServers, dicts or a name -> dict mapping, not {type(servers).__name__}"
        )
    out = tuple(items)
    names = [s.name for s in out]
    if not out:
        raise ValueError("MCPEnv needs at least one MCP server")
    if len(set(names)) != len(names):
        raise ValueError(f"two MCP servers share a name: {names}")
    return out


def _one_server(spec: Any) -> MCPServer:
    if isinstance(spec, MCPServer):
        return spec
    if isinstance(spec, Mapping) and "name" in spec:
        return MCPServer.from_dict(str(spec["name"]), spec)
    raise TypeError(f"an MCP server is an MCPServer or a dict with a 'name', not {spec!r:.80}")


@dataclass(eq=False)
class _Connection:
    """One server's live connection, owned by ``task`` (which entered the SDK's contexts)."""

    server: MCPServer
    loop: asyncio.AbstractEventLoop
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


class MCPEnv(ToolEnv):
    """A ``ToolEnv`` whose tools come from MCP ``servers`` (see the module docstring).

    ``servers``: an ``MCPServer``, a list of them (or of dicts with a ``name``), or an
    ``mcpServers``-style mapping name -> ``{"command": ..., "args": [...]}`` / ``{"url": ...}``.
    ``prefix_tools``: name tools ``<server>_<tool>``; None (default) does so when there is more
    than one server. ``tools`` are local functions or ``Tool``s offered next to the servers'.
    ``fatal_errors`` adds to ``MCPConnectionError``. Other keyword arguments are ``ToolEnv``'s
    (``dataset``, ``system_prompt``, ``rubric``, ``max_turns``, ...). A subclass overriding
    ``setup_state`` or ``env_response`` must call ``super()``'s.
    """

    def __init__(
        self,
        servers: Any,
        *,
        prefix_tools: bool | None = None,
        fatal_errors: tuple[type[BaseException], ...] = (),
        close_timeout: float = 10.0,
        **kwargs: Any,
    ) -> None:
        _require_mcp()
        self.servers = parse_servers(servers)
        self.prefix_tools = len(self.servers) > 1 if prefix_tools is None else bool(prefix_tools)
        self.close_timeout = close_timeout
        self.mcp_tools: dict[str, tuple[str, str]] = {}  # exposed name -> (server name, MCP tool name)
        self._conns: dict[str, _Connection] = {}
        self._owners: dict[asyncio.Task[None], _Connection] = {}  # running owner tasks, dropped ones too
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        super().__init__(fatal_errors=(MCPConnectionError, *fatal_errors), **kwargs)

    # --- lifecycle -----------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect to every server not connected yet (concurrently) and register its tools.

        Called by each rollout's ``setup_state``; call it yourself to have ``env.tools`` filled
        before a run. Raises ``MCPConnectionError`` naming a server that cannot be reached.
        """
        loop = asyncio.get_running_loop()
        if all(self._live(s.name, loop) for s in self.servers):
            return
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        async with self._lock:
            missing = [s for s in self.servers if not self._live(s.name, loop)]
            results = await asyncio.gather(*(self._open(s) for s in missing), return_exceptions=True)
            for outcome in results:
                if isinstance(outcome, BaseException):
                    raise outcome

    async def aclose(self) -> None:
        """Close every connection and wait for it: no server process, task or session is left.

        Idempotent; the env reconnects if it is used again.
        """
        self._conns = {}
        loop = asyncio.get_running_loop()
        owners = {t: c for t, c in self._owners.items() if t.get_loop() is loop and not t.done()}
        self._owners = owners.copy()  # those of an ended event loop are gone with it
        for conn in owners.values():
            conn.dead = True
            conn.closing.set()
            if not conn.ready.done() and conn.scope is not None:  # still connecting: cut it short
                conn.scope.cancel()
        if not owners:
            return
        _, pending = await asyncio.wait(owners, timeout=self.close_timeout)
        if pending:  # a graceful close that hangs: force it (the SDK's shutdown is shielded)
            for task in pending:
                if owners[task].scope is not None:
                    owners[task].scope.cancel()
            _, pending = await asyncio.wait(pending, timeout=self.close_timeout)
        for task in pending:  # last resort
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    def is_connected(self, server: str) -> bool:
        """Whether ``server`` has a live connection (False before first use and after ``aclose``)."""
        conn = self._conns.get(server)
        return conn is not None and conn.registered and conn.usable()

    def _live(self, name: str, loop: asyncio.AbstractEventLoop) -> bool:
        conn = self._conns.get(name)
        if conn is None:
            return False
        if conn.loop is not loop:  # a connection of an earlier event loop (asyncio.run ended it)
            self._conns.pop(name)
            if conn.task is not None:
                self._owners.pop(conn.task, None)
            return False
        return conn.registered and conn.usable()

    async def _open(self, server: MCPServer) -> _Connection:
        """Connect ``server`` (or wait for the connection under way) and register its tools."""
        loop = asyncio.get_running_loop()
        conn = self._conns.get(server.name)  # one still connecting (its waiter was cancelled) is reused
        if conn is None or conn.loop is not loop or (conn.ready.done() and not conn.usable()):
            if conn is not None:
                self._drop(conn)
            conn = _Connection(server, loop)
            conn.task = loop.create_task(self._own(conn), name=f"palaestra-mcp-{server.name}")
            self._owners[conn.task] = conn
            conn.task.add_done_callback(lambda task: self._owners.pop(task, None))
            self._conns[server.name] = conn
        await asyncio.wait({conn.ready})  # never cancels the connection, only this wait
        if conn.ready.exception() is not None or not conn.usable():
            self._drop(conn)
            raise MCPConnectionError(
                f"cannot connect to MCP server {server.name!r} ({_describe(server)}){conn.why()}"
            )
        if not conn.registered:
            try:
                self._register(conn)
            except Exception:
                self._drop(conn)
                raise
            conn.registered = True
        return conn

    async def _own(self, conn: _Connection) -> None:
        """The connection's owner task: enter the SDK's contexts, list the tools, hold them open
        until ``closing`` is set (or the transport fails), then leave them, all in this task."""
        import anyio
        from mcp import Client

        server = conn.server
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + server.connect_timeout) as scope:
                conn.scope = scope
                async with contextlib.AsyncExitStack() as stack:
                    target = await _transport(server, stack)
                    client = await stack.enter_async_context(Client(target, cache=None))
                    conn.tools = await _list_tools(client)
                    conn.client = client
                    scope.deadline = math.inf
                    conn.ready.set_result(None)
                    await conn.closing.wait()
            if scope.cancelled_caught and not conn.ready.done():
                why = "closed while connecting" if conn.closing.is_set() else "timed out"
                raise TimeoutError(f"{why} after {server.connect_timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - kept for the messages; the connection is dead
            conn.error = exc
        finally:
            conn.dead = True
            if not conn.ready.done():
                conn.ready.set_exception(MCPConnectionError(f"MCP server {server.name!r}{conn.why()}"))

    def _drop(self, conn: _Connection) -> None:
        """Forget a dead connection and let its owner task leave its contexts (``aclose`` awaits it)."""
        conn.dead = True
        if self._conns.get(conn.server.name) is conn:
            del self._conns[conn.server.name]
        conn.closing.set()

    def _register(self, conn: _Connection) -> None:
        """Add (or refresh, after a reconnection) the server's tools in ``tool_map``; a name
        clash adds none of them."""
        server = conn.server
        made: dict[str, tuple[Tool, str]] = {}
        for info in conn.tools:
            name = _INVALID.sub("_", f"{server.name}_{info.name}" if self.prefix_tools else info.name)[:64]
            owner = self.mcp_tools.get(name)
            taken = name in made or (owner is None and name in self.tool_map)
            if taken or (owner is not None and owner[0] != server.name):
                where = f"MCP server {owner[0]!r}'s" if owner else "another tool's"
                raise MCPConnectionError(
                    f"MCP server {server.name!r}: its tool {info.name!r} would be named {name!r}, "
                    f"which is already {where} name"
                    + ("" if self.prefix_tools else "; use MCPEnv(..., prefix_tools=True)")
                )
            parameters = dict(info.input_schema or {})
            parameters.setdefault("type", "object")
            parameters.setdefault("properties", {})
            tool = Tool(
                name=name,
                description=info.description or info.title or "",
                parameters=parameters,
                func=self._tool_func(server.name, info.name),
                timeout=server.timeout,
            )
            made[name] = (tool, info.name)
        for name, (tool, original) in made.items():
            self.tool_map[name] = tool
            self.mcp_tools[name] = (server.name, original)
        self.tools = self._schemas()

    def _tool_func(self, server: str, tool: str) -> Any:
        async def call(**arguments: Any) -> str:
            return await self.call_tool(server, tool, arguments)

        call.__name__ = call.__qualname__ = f"{server}.{tool}"
        return call

    # --- rollouts ------------------------------------------------------------------------------

    async def setup_state(self, state: State) -> None:
        """Connect what is not connected; remember which connections this rollout uses."""
        await super().setup_state(state)
        try:
            await self.connect()
        except MCPConnectionError as exc:
            raise EpisodeError(ErrorInfo(type(exc).__name__, str(exc), stage="tool")) from exc
        state.resources[_GENERATIONS] = {name: conn.generation for name, conn in self._conns.items()}

    async def env_response(self, messages: Messages, state: State) -> Messages:
        token = _ROLLOUT.set(state)  # the tool calls (tasks of their own) read it
        try:
            return await super().env_response(messages, state)
        finally:
            _ROLLOUT.reset(token)

    async def call_tool(self, server: str, tool: str, arguments: dict[str, Any]) -> str:
        """Call MCP tool ``tool`` of ``server``; its result as text.

        Raises ``MCPToolError`` for an ``isError`` result or a protocol error, and
        ``MCPConnectionError`` when the server is gone (the connection is then dropped). Outside
        a rollout it connects first if needed.
        """
        state = _ROLLOUT.get(None)
        conn = self._conns.get(server)
        if state is not None and _GENERATIONS in state.resources:
            expected = state.resources[_GENERATIONS].get(server)
            if conn is None or conn.generation != expected or not conn.usable():
                raise MCPConnectionError(f"MCP server {server!r} was disconnected during this rollout")
        elif conn is None or not conn.usable():
            if all(s.name != server for s in self.servers):
                raise KeyError(f"no MCP server named {server!r}")
            await self.connect()
            conn = self._conns[server]
        assert conn.client is not None and conn.task is not None
        call = asyncio.ensure_future(conn.client.call_tool(tool, arguments))
        try:
            await asyncio.wait({call, conn.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not call.done():  # cancelled (a timeout), or the connection ended first
                call.cancel()
                await asyncio.wait({call}, timeout=1.0)
        lost = f"MCP server {server!r} ({_describe(conn.server)}) closed the connection"
        if not call.done() or call.cancelled():  # the transport failed and tore the call down
            self._drop(conn)
            raise MCPConnectionError(lost + conn.why())
        exc = call.exception()
        if exc is not None:
            if _connection_lost(exc):
                self._drop(conn)
                raise MCPConnectionError(f"{lost}: {type(exc).__name__}: {exc}") from exc
            if _is_mcp_error(exc):
                raise MCPToolError(str(getattr(exc, "message", exc))) from exc
            raise exc
        result = call.result()
        text = result_text(result)
        if result.is_error:
            raise MCPToolError(text or "the tool reported an error")
        return text


def result_text(result: CallToolResult) -> str:
    """A ``CallToolResult`` as a tool message: text parts as they are, others as placeholders,
    joined by newlines; the structured content as JSON when there is no content."""
    parts = []
    for block in result.content:
        kind = getattr(block, "type", "?")
        if kind == "text":
            parts.append(block.text)  # type: ignore[union-attr]
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '?')}]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {getattr(block, 'uri', '?')}]")
        elif kind == "resource":
            resource = getattr(block, "resource", None)
            text = getattr(resource, "text", None)
            if isinstance(text, str):
                parts.append(text)
            else:
                mime = getattr(resource, "mime_type", None) or "binary"
                parts.append(f"[resource: {getattr(resource, 'uri', '?')} ({mime})]")
        else:
            parts.append(f"[{kind} content]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


def _peer_closed(client: Any) -> bool:
    """Whether the SDK saw the server close the connection (a stdio server that exited while
    idle); best effort, through private attributes: False when they are not there."""
    try:
        return bool(client.session._dispatcher._closed)
    except Exception:  # noqa: BLE001 - another SDK version: no early detection, calls still fail
        return False


def _describe(server: MCPServer) -> str:
    if server.url is not None:
        return server.url
    return " ".join([str(server.command), *server.args])[:120]


async def _transport(server: MCPServer, stack: contextlib.AsyncExitStack) -> Any:
    """What ``mcp.Client`` connects to: stdio parameters, or a streamable-HTTP transport whose
    HTTP client (with the headers) ``stack`` closes."""
    from mcp import StdioServerParameters

    if server.command is not None:
        return StdioServerParameters(
            command=server.command,
            args=list(server.args),
            env=dict(server.env) if server.env is not None else None,
            cwd=server.cwd,
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


def _require_mcp() -> None:
    try:
        import mcp
    except ImportError as exc:
        raise ImportError("MCPEnv needs the MCP SDK: pip install 'palaestra[mcp]' (mcp 2.x)") from exc
    if not hasattr(mcp, "Client"):
        version = getattr(sys.modules.get("mcp"), "__version__", "1.x")
        raise ImportError(f"MCPEnv needs mcp 2.x (its mcp.Client); this is mcp {version}")
