"""MCPEnv: the tools of Model Context Protocol servers, called by the model like any ``ToolEnv`` tool.

Each server is an ``MCPServer``: a command run over stdio, or a streamable-HTTP URL. The env
connects lazily, inside the running event loop: at the start of the first rollout (or on
``await env.connect()``, for the tool list up front), to every server at once. Each MCP tool
becomes a ``Tool`` whose ``parameters`` are the server's ``inputSchema`` unchanged; the server
checks the arguments. Tool names are the server's, or ``<server>_<tool>`` when ``prefix_tools``
is true (by default: when there is more than one server), characters the OpenAI API refuses
replaced by ``_``. Two tools with one name are refused at connection time.

A result's text parts are the tool message; other parts read as placeholders (``[image:
image/png]``), so no image or blob bytes reach the model; the text is cut to the cap of
``ToolEnv`` (``max_result_chars``: the server's, else the environment's). A result with
``isError`` set, or an MCP protocol error, is an ``Error: ...`` for the model (counted in
``tool_errors``). A server that goes away mid-rollout (its process killed, its HTTP server gone)
ends that rollout with an ``MCPConnectionError``, stage ``tool``, naming the server; the dead
connection is dropped and the next rollout reconnects. So does a server that never finishes
connecting (``MCPServer(connect_timeout=)``, 30 s by default), and one that sends something
that is not MCP (``MCPProtocolError``: a stdout line that is not JSON-RPC, an HTTP body that is
not JSON) at once rather than at a timeout, with one log line for it (``mcp_guard``). A rollout
that began on a connection which was replaced meanwhile fails the same way: the server's
session state it relied on is gone.

Each connection lives in a background task of its own (the SDK's contexts must be entered and
left in one task; ``mcp_connection``); tool calls use its session from any task. ``aclose()``
ends them all: stdio servers get their stdin closed, then SIGTERM/SIGKILL (the SDK's shutdown),
HTTP sessions are terminated. The env stays usable after it and reconnects on demand. Needs ``pip install
'palaestra[mcp]'`` (the ``mcp`` SDK, 2.x).
"""

from __future__ import annotations

import asyncio
import contextvars
import re
from typing import Any

from palaestra.envs.mcp_config import MCPServer, parse_servers
from palaestra.envs.mcp_connection import (
    Connection,
    MCPConnectionError,
    MCPProtocolError,
    MCPToolError,
    call,
    describe,
    own,
    require_mcp,
)
from palaestra.envs.mcp_guard import LogScope
from palaestra.envs.multiturn import EpisodeError
from palaestra.envs.tool import ToolEnv
from palaestra.tools import Tool, ToolDefinitionError
from palaestra.types import ErrorInfo, Messages, State

__all__ = ["MCPConnectionError", "MCPEnv", "MCPProtocolError", "MCPServer", "MCPToolError", "parse_servers"]

_INVALID = re.compile(r"[^a-zA-Z0-9_-]")
_GENERATIONS = "mcp_connections"  # state.resources key: server name -> connection generation
_ROLLOUT: contextvars.ContextVar[State] = contextvars.ContextVar("palaestra_mcp_rollout")


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
        require_mcp()
        self.servers = parse_servers(servers)
        self.prefix_tools = len(self.servers) > 1 if prefix_tools is None else bool(prefix_tools)
        self.close_timeout = close_timeout
        self.mcp_tools: dict[str, tuple[str, str]] = {}  # exposed name -> (server name, MCP tool name)
        self._conns: dict[str, Connection] = {}
        self._owners: dict[asyncio.Task[None], Connection] = {}  # running owner tasks, dropped ones too
        self._logs: dict[str, LogScope] = {}  # per server, across its connections: one line per problem
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

    async def _open(self, server: MCPServer) -> Connection:
        """Connect ``server`` (or wait for the connection under way) and register its tools."""
        loop = asyncio.get_running_loop()
        conn = self._conns.get(server.name)  # one still connecting (its waiter was cancelled) is reused
        if conn is None or conn.loop is not loop or (conn.ready.done() and not conn.usable()):
            if conn is not None:
                self._drop(conn)
            logs = self._logs.setdefault(server.name, LogScope(server.name))
            conn = Connection(server, loop, logs)
            conn.task = loop.create_task(own(conn), name=f"palaestra-mcp-{server.name}")
            self._owners[conn.task] = conn
            conn.task.add_done_callback(lambda task: self._owners.pop(task, None))
            self._conns[server.name] = conn
        await asyncio.wait({conn.ready})  # never cancels the connection, only this wait
        if conn.ready.exception() is not None or not conn.usable():
            self._drop(conn)
            raise MCPConnectionError(
                f"cannot connect to MCP server {server.name!r} ({describe(server)}){conn.why()}"
            )
        if not conn.registered:
            try:
                self._register(conn)
            except Exception:
                self._drop(conn)
                raise
            conn.registered = True
        return conn

    def _drop(self, conn: Connection) -> None:
        """Forget a dead connection and let its owner task leave its contexts (``aclose`` awaits it)."""
        conn.dead = True
        if self._conns.get(conn.server.name) is conn:
            del self._conns[conn.server.name]
        conn.closing.set()

    def _register(self, conn: Connection) -> None:
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
            try:
                tool = Tool(
                    name=name,
                    description=info.description or info.title or "",
                    parameters=parameters,
                    func=self._tool_func(server.name, info.name),
                    timeout=server.timeout,
                    max_result_chars=server.max_result_chars,
                )
            except ToolDefinitionError as exc:  # a schema or name no model API takes
                raise MCPConnectionError(
                    f"MCP server {server.name!r}: its tool {info.name!r:.100}: {exc}"
                ) from exc
            made[name] = (tool, info.name)
        for name, (tool, original) in made.items():
            self.tool_map[name] = tool
            self.mcp_tools[name] = (server.name, original)
        self.tools = self._schemas()

    def _tool_func(self, server: str, tool: str) -> Any:
        async def run(**arguments: Any) -> str:
            return await self.call_tool(server, tool, arguments)

        run.__name__ = run.__qualname__ = f"{server}.{tool}"
        return run

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
                why = conn.why() if conn is not None and conn.generation == expected else ""
                raise MCPConnectionError(f"MCP server {server!r} was disconnected during this rollout{why}")
        elif conn is None or not conn.usable():
            if all(s.name != server for s in self.servers):
                raise KeyError(f"no MCP server named {server!r}")
            await self.connect()
            conn = self._conns[server]
        try:
            return await call(conn, tool, arguments)
        except MCPConnectionError:
            self._drop(conn)
            raise
