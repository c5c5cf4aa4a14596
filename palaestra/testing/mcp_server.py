"""A small MCP server for tests of ``MCPEnv``, written with the official ``mcp`` SDK.

Tools: ``add(a, b)``, ``echo(text)``, ``fail(message)`` (an ``isError`` result), ``sleep(seconds)``,
``pid()`` (the server's process id, so a test can find and kill it), ``picture()`` (an image, for
non-text content), ``getenv(name)``, ``header(name)`` (an HTTP request header; "" over stdio),
``big(chars)`` (a text of that many characters) and ``garble()``, whose call breaks the protocol:
over stdio it writes lines that are not JSON-RPC to stdout, over HTTP it is answered with a body
that is not JSON. Run it as

    python -m palaestra.testing.mcp_server --transport stdio
    python -m palaestra.testing.mcp_server --transport http --port 0

Over HTTP it serves streamable HTTP at ``/mcp`` on 127.0.0.1 and prints ``READY <url>`` once it
accepts connections; SIGTERM/SIGINT stop it. Over stdio it exits when its stdin closes.

``--misbehave silent`` never answers anything (over HTTP: it accepts each request and holds it);
``--misbehave garbage`` answers nothing but text that is not MCP (over stdio: a line every
millisecond, until its stdin closes).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

# a 1x1 transparent PNG
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def build_server(name: str = "palaestra-test") -> MCPServer:
    """The test server's tools on an SDK ``MCPServer``."""
    server: MCPServer = MCPServer(name, log_level="WARNING")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    def fail(message: str = "it failed") -> str:
        """Always fail, with ``message``."""
        raise ToolError(message)

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Wait ``seconds`` seconds, then answer "slept"."""
        await asyncio.sleep(seconds)
        return "slept"

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool()
    def picture() -> Image:
        """A one-pixel PNG."""
        return Image(data=PIXEL, format="png")

    @server.tool()
    def getenv(name: str) -> str:
        """The server process's environment variable ``name`` ("" if unset)."""
        return os.environ.get(name, "")

    @server.tool()
    def header(name: str, ctx: Context) -> str:
        """The HTTP request's header ``name`` ("" if absent, or over stdio)."""
        request = ctx.request_context.request
        headers = getattr(request, "headers", None)
        return str(headers.get(name, "")) if headers is not None else ""

    @server.tool()
    def big(chars: int) -> str:
        """A text of ``chars`` characters."""
        return "x" * chars

    @server.tool()
    def garble() -> str:
        """Break the protocol: write lines that are not JSON-RPC where the messages go (stdio)."""
        if _wire is not None:
            os.write(_wire, GARBAGE * 3)
        return "garbled"

    return server


GARBAGE = b"this is not JSON-RPC\n"
_wire: int | None = None  # over stdio: the messages' pipe, taken before the SDK diverts stdout


def misbehaving(app: Any, mode: str | None) -> Any:
    """The ASGI ``app``, but a call of ``garble`` (or, in ``mode`` "garbage", every POST) is
    answered with a body that is not JSON, and in ``mode`` "silent" no POST is ever answered."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if mode == "silent":
            await asyncio.Event().wait()  # accepted, never answered
        try:
            request = json.loads(body)
        except ValueError:
            request = {}
        called = request.get("params", {}).get("name") if isinstance(request, dict) else None
        if mode == "garbage" or (request.get("method") == "tools/call" and called == "garble"):
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": GARBAGE})
            return None
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return dict(await receive())
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await app(scope, replay, send)

    return asgi


def misbehave_stdio(mode: str) -> None:
    """Read stdin until it closes; answer nothing ("silent") or only garbage ("garbage")."""
    done = threading.Event()

    def drain() -> None:
        for _ in sys.stdin.buffer:
            pass
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    while not done.is_set():
        if mode == "garbage":
            try:
                os.write(sys.stdout.fileno(), GARBAGE)
            except OSError:  # the reader is gone
                return
        time.sleep(0.001)


async def serve_http(
    server: MCPServer, host: str = "127.0.0.1", port: int = 0, misbehave: str | None = None
) -> None:
    """Serve streamable HTTP until SIGTERM/SIGINT; print ``READY <url>`` once listening."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may take the same port
    sock.bind((host, port))
    port = sock.getsockname()[1]
    app = misbehaving(server.streamable_http_app(host=host), misbehave)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
    web = uvicorn.Server(config)  # stops on SIGTERM/SIGINT
    task = asyncio.create_task(web.serve(sockets=[sock]))
    while not web.started and not task.done():
        await asyncio.sleep(0.01)
    if web.started:
        print(f"READY http://{host}:{port}/mcp", flush=True)
    await task


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the test tools over stdio or streamable HTTP."""
    parser = argparse.ArgumentParser(prog="python -m palaestra.testing.mcp_server", description=__doc__)
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="HTTP port; 0 picks a free one")
    parser.add_argument("--name", default="palaestra-test")
    parser.add_argument("--misbehave", choices=["silent", "garbage"], help="break the protocol (tests)")
    args = parser.parse_args(argv)
    server = build_server(args.name)
    if args.transport == "stdio" and args.misbehave:
        misbehave_stdio(args.misbehave)
    elif args.transport == "stdio":
        global _wire
        _wire = os.dup(sys.stdout.fileno())
        server.run("stdio")
    else:
        asyncio.run(serve_http(server, args.host, args.port, args.misbehave))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
