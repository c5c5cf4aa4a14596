"""``MCPServer``: how to reach one MCP server (a command over stdio, or a streamable-HTTP URL), and
``parse_servers``, which reads the forms ``MCPEnv(servers=...)`` takes (``mcpServers``-style dicts
among them). Needs no MCP SDK."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from palaestra.tools import NAME, check_result_cap

__all__ = ["DEFAULT_CALL_TIMEOUT", "DEFAULT_CONNECT_TIMEOUT", "MCPServer", "parse_servers"]

DEFAULT_CALL_TIMEOUT = 60.0  # seconds a tool call may take
DEFAULT_CONNECT_TIMEOUT = 30.0  # seconds to start a server, shake hands and list its tools


@dataclass(frozen=True)
class MCPServer:
    """One MCP server: ``command`` (+ ``args``, ``env``, ``cwd``) over stdio, or ``url`` (+
    ``headers``) over streamable HTTP; exactly one of the two.

    ``env`` is merged over the SDK's minimal default environment (PATH, HOME, ...), not over
    ``os.environ``. ``timeout`` bounds each tool call (seconds, default 60), ``connect_timeout``
    starting the server, the handshake and listing its tools (default 30): a server that never
    answers fails the rollout when it runs out. ``max_result_chars`` caps its tools' results
    (None: the environment's cap). ``name`` (letters, digits, ``_``, ``-``) names the server in
    errors and in prefixed tool names.
    """

    name: str
    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    timeout: float = DEFAULT_CALL_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    max_result_chars: int | None = None

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
        if self.max_result_chars is not None:
            check_result_cap(self.max_result_chars, f"{where}: max_result_chars")

    @property
    def transport(self) -> str:
        """``"stdio"`` or ``"http"``."""
        return "stdio" if self.command is not None else "http"

    @classmethod
    def from_dict(cls, name: str, spec: Mapping[str, Any]) -> MCPServer:
        """A server from an ``mcpServers``-style entry: ``{"command", "args", "env", "cwd"}`` or
        ``{"url", "headers"}``, plus ``timeout``, ``connect_timeout`` and ``max_result_chars``; a
        ``type``/``transport`` of
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
