"""MCPEnv end to end: real MCP servers (palaestra.testing.mcp_server, over stdio and streamable
HTTP), a real OpenAI-compatible fake model server with scripted tool-calling replies."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("mcp")

import palaestra as pa
from palaestra.envs.mcp import MCPConnectionError, MCPEnv, MCPServer, parse_servers
from palaestra.testing import FakeOpenAIServer, mcp_server

# leaks show up as warnings (an unclosed transport, a coroutine never awaited): fail on them
pytestmark = pytest.mark.filterwarnings(
    "error::ResourceWarning", "error::pytest.PytestUnraisableExceptionWarning", "error::RuntimeWarning"
)

# run as a script, the server does not import palaestra: it starts 0.3 s sooner
SERVER = [sys.executable, mcp_server.__file__]
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}},
    "required": ["a", "b"],
    "title": "addArguments",
}


def call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def turn_of(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def tool_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def scripted(*turns: list[dict[str, Any]]) -> Callable[[dict[str, Any]], Any]:
    """The i-th assistant turn makes the calls ``turns[i]``; then it answers with the tool results."""

    def reply(body: dict[str, Any]) -> Any:
        made = turn_of(body)
        if made < len(turns):
            return {"content": None, "tool_calls": turns[made]}
        return "results: " + " | ".join(tool_texts(body))

    return reply


def client_for(server: FakeOpenAIServer) -> pa.OpenAIClient:
    return pa.OpenAIClient(server.model, base_url=server.base_url, timeout=10.0, max_retries=0)


def stdio(name: str = "calc", **options: Any) -> MCPServer:
    return MCPServer(name, command=SERVER[0], args=SERVER[1:], **options)


def env_for(*servers: MCPServer, **kwargs: Any) -> MCPEnv:
    return MCPEnv(list(servers), dataset=[{"question": "compute", "answer": "5"}], max_turns=4, **kwargs)


HTTP_SERVER_PIDS: set[int] = set()  # started by the http_server fixture, which stops them itself


def children() -> set[int]:
    """Live or unreaped child processes of this process (read from /proc), but the HTTP servers."""
    me, found = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            found.add(int(entry))
    return found - HTTP_SERVER_PIDS


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def leftover_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]


async def eventually(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


class HTTPServer:
    """The test MCP server as a streamable-HTTP process on 127.0.0.1; restartable on its port.
    ``args`` are more of its options (``--misbehave garbage``)."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> None:
        cmd = [*SERVER, "--transport", "http", "--port", str(self.port), *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        HTTP_SERVER_PIDS.add(self.proc.pid)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        line = self.proc.stdout.readline() if ready else ""
        assert line.startswith("READY "), f"the MCP test server did not start: {line!r}"
        self.url = line.split()[1]
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(10)
            assert self.proc.stdout is not None
            self.proc.stdout.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


@pytest.fixture
def http_server() -> Iterator[HTTPServer]:
    server = HTTPServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def no_leaks() -> AsyncIterator[None]:
    """After the test: no child process it started, no pending task."""
    before = children()
    yield
    assert children() - before == set()
    assert leftover_tasks() == []


def server_for(transport: str, http: HTTPServer | None) -> MCPServer:
    if transport == "stdio":
        return stdio()
    assert http is not None
    return MCPServer("calc", url=http.url)


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def maybe_http(transport: str, request: pytest.FixtureRequest) -> HTTPServer | None:
    return request.getfixturevalue("http_server") if transport == "http" else None


# --- tools, results, errors --------------------------------------------------------------------


async def test_tools_listed_and_parallel_calls_answer_in_call_order(
    transport: str, maybe_http: HTTPServer | None, no_leaks: None
) -> None:
    env = env_for(server_for(transport, maybe_http))
    assert env.tools is None  # nothing listed before connecting
    turn = [
        call("sleep", {"seconds": 0.4}, "c0"),  # finishes last, answered first
        call("add", {"a": 2, "b": 3}, "c1"),
        call("echo", {"text": "hello there"}, "c2"),
        call("sleep", {"seconds": 0.4}, "c3"),
    ]
    async with env, FakeOpenAIServer(scripted(turn)) as server, client_for(server) as client:
        start = time.perf_counter()
        await env.connect()
        connect_time = time.perf_counter() - start
        assert set(env.tool_map) == set("add echo fail sleep pid picture getenv header big garble".split())
        assert env.tool_map["add"].parameters == ADD_SCHEMA  # the server's inputSchema, as it is
        assert env.tool_map["add"].description == "Add two integers."
        [rollout] = await env.run(client)
        sent_tools = {t["function"]["name"]: t["function"] for t in server.requests[0]["tools"]}
    print(f"{transport}: connect {connect_time:.2f} s")
    assert sent_tools["add"]["parameters"] == ADD_SCHEMA
    assert rollout.error is None and rollout.stop_reason == "no_tool_calls"
    tools = [m for m in rollout.completion if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["c0", "c1", "c2", "c3"]
    assert [m["content"] for m in tools] == ["slept", "5", "hello there", "slept"]
    assert rollout.turns[0].env_time < 0.75  # the two sleeps ran at the same time
    assert rollout.metrics["tool_calls"] == 4 and rollout.metrics["tool_errors"] == 0
    assert rollout.metrics["add_calls"] == 1 and rollout.metrics["sleep_calls"] == 2
    assert rollout.reward is not None


async def test_tool_errors_are_for_the_model_to_read(no_leaks: None) -> None:
    turn = [
        call("fail", {"message": "no luck"}, "c0"),
        call("add", {"a": "x", "b": 1}, "c1"),  # the server checks the arguments
        call("picture", {}, "c2"),
        call("sleep", {"seconds": 5}, "c3"),  # past the server's 0.5 s timeout
        call("getenv", {"name": "PALAESTRA_MCP_TEST"}, "c4"),
    ]
    env = env_for(stdio(timeout=0.5, env={"PALAESTRA_MCP_TEST": "given"}))
    async with env, FakeOpenAIServer(scripted(turn, [call("add", {"a": 1, "b": 1}, "c5")])) as server:
        async with client_for(server) as client:
            [rollout] = await env.run(client)
    assert rollout.error is None and rollout.stop_reason == "no_tool_calls"
    texts = [m["content"] for m in rollout.completion if m["role"] == "tool"]
    assert texts[0].startswith("Error: fail raised MCPToolError:") and "no luck" in texts[0]
    assert texts[1].startswith("Error: add raised MCPToolError:") and "valid integer" in texts[1]
    assert texts[2] == "[image: image/png]"
    assert texts[3] == "Error: sleep timed out after 0.5 s."
    assert texts[4] == "given"  # the server's env
    assert texts[5] == "2"  # the server is still usable after a timed-out call
    assert rollout.metrics["tool_errors"] == 3
    assert rollout.metrics["fail_errors"] == 1 and rollout.metrics["sleep_errors"] == 1


async def test_local_tools_mix_in_and_several_servers_are_prefixed(no_leaks: None) -> None:
    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    turn = [call("left_add", {"a": 1, "b": 2}, "c0"), call("right_echo", {"text": "r"}, "c1")]
    env = env_for(stdio("left"), stdio("right"), tools=[double])
    async with env, FakeOpenAIServer(scripted(turn, [call("double", {"x": 4}, "c2")])) as server:
        async with client_for(server) as client:
            [rollout] = await env.run(client)
    assert {"double", "left_add", "right_add", "left_pid", "right_pid"} <= set(env.tool_map)
    assert env.mcp_tools["right_echo"] == ("right", "echo")
    assert rollout.error is None
    assert [m["content"] for m in rollout.completion if m["role"] == "tool"] == ["3", "r", "8"]


async def test_a_clash_with_a_local_tool_is_refused(no_leaks: None) -> None:
    def echo(text: str) -> str:
        """A local echo."""
        return text

    env = env_for(stdio(), tools=[echo])
    with pytest.raises(MCPConnectionError, match="prefix_tools=True"):
        await env.connect()
    assert not env.is_connected("calc") and set(env.tool_map) == {"echo"}  # none of its tools
    await env.aclose()


async def test_an_unreachable_server_is_a_tool_error_of_the_rollout(no_leaks: None) -> None:
    missing = MCPServer("ghost", command="/nonexistent/mcp-server")
    closed = MCPServer("nobody", url="http://127.0.0.1:9/mcp", connect_timeout=5)
    for server in (missing, closed):
        env = env_for(server)
        async with env, FakeOpenAIServer(scripted([])) as fake, client_for(fake) as client:
            [rollout] = await env.run(client)
        assert rollout.error is not None and rollout.error.stage == "tool"
        assert rollout.error.type == "MCPConnectionError" and repr(server.name) in rollout.error.message
        assert fake.request_count == 0


# --- servers that go away ----------------------------------------------------------------------


def pid_of(rollout: pa.Rollout) -> int:
    return int(next(m["content"] for m in rollout.completion if m["role"] == "tool"))


async def test_stdio_server_killed_mid_rollout_ends_it_and_the_next_reconnects(no_leaks: None) -> None:
    async def reply(body: dict[str, Any]) -> Any:
        made = turn_of(body)
        if made == 0:
            return {"content": None, "tool_calls": [call("pid", {}, "c0")]}
        if made == 1 and body["messages"][0]["content"] == "kill":
            pid = int(tool_texts(body)[0])
            asyncio.get_running_loop().call_later(0.3, os.kill, pid, signal.SIGKILL)
            return {"content": None, "tool_calls": [call("sleep", {"seconds": 10}, "c1")]}
        return "done"

    env = MCPEnv(stdio(), dataset=[{"prompt": [{"role": "user", "content": "kill"}]}, {"question": "live"}])
    async with env, FakeOpenAIServer(reply) as server, client_for(server) as client:
        killed, fine = env.examples
        start = time.perf_counter()
        first = await env.rollout(client, killed)
        elapsed = time.perf_counter() - start
        second = await env.rollout(client, fine)
        pids = (pid_of(first), pid_of(second))
    assert first.error is not None and first.error.stage == "tool", first.error
    assert first.error.type == "MCPConnectionError" and "'calc'" in first.error.message
    assert elapsed < 5  # not the 10 s sleep
    assert first.metrics["sleep_calls"] == 1
    assert second.error is None and second.stop_reason == "no_tool_calls"
    assert pids[0] != pids[1]  # a new server process
    assert not alive(pids[0]) and not alive(pids[1])


async def test_stdio_server_gone_between_rollouts_is_restarted(no_leaks: None) -> None:
    env = env_for(stdio())
    async with env, FakeOpenAIServer(scripted([call("pid", {}, "c0")])) as server:
        async with client_for(server) as client:
            [first] = await env.run(client)
            os.kill(pid_of(first), signal.SIGKILL)
            await eventually(lambda: not env.is_connected("calc"))
            [second] = await env.run(client)
    assert first.error is None and second.error is None
    assert pid_of(first) != pid_of(second)


async def test_a_rollout_whose_server_was_replaced_meanwhile_fails(no_leaks: None) -> None:
    env = env_for(stdio())

    async def reply(body: dict[str, Any]) -> Any:
        made = turn_of(body)
        if made == 0:
            return {"content": None, "tool_calls": [call("pid", {}, "c0")]}
        if made == 1:  # the server dies between two turns and another rollout reconnects
            os.kill(int(tool_texts(body)[0]), signal.SIGKILL)
            await eventually(lambda: not env.is_connected("calc"))
            await env.connect()
            return {"content": None, "tool_calls": [call("add", {"a": 1, "b": 1}, "c1")]}
        return "done"

    async with env, FakeOpenAIServer(reply) as server, client_for(server) as client:
        [rollout] = await env.run(client)
    assert rollout.error is not None and rollout.error.stage == "tool"
    assert "'calc' was disconnected during this rollout" in rollout.error.message


async def test_http_server_stopped_mid_rollout_ends_it_and_the_next_reconnects(
    http_server: HTTPServer, no_leaks: None
) -> None:
    def reply(body: dict[str, Any]) -> Any:
        made = turn_of(body)
        if made == 0 and body["messages"][0]["content"] == "kill":
            asyncio.get_running_loop().call_later(0.3, http_server.kill)
            return {"content": None, "tool_calls": [call("sleep", {"seconds": 10}, "c0")]}
        if made == 0:
            turn = [call("add", {"a": 1, "b": 2}, "c0"), call("header", {"name": "x-palaestra"}, "c1")]
            return {"content": None, "tool_calls": turn}
        return "done"

    env = MCPEnv(
        MCPServer("web", url=http_server.url, headers={"X-Palaestra": "sent"}),
        dataset=[{"prompt": [{"role": "user", "content": "kill"}]}, {"question": "live"}],
    )
    async with env, FakeOpenAIServer(reply) as server, client_for(server) as client:
        killed, fine = env.examples
        start = time.perf_counter()
        first = await env.rollout(client, killed)
        elapsed = time.perf_counter() - start
        await asyncio.to_thread(http_server.start)  # back on the same port
        second = await env.rollout(client, fine)
    assert first.error is not None and first.error.stage == "tool", first.error
    assert first.error.type == "MCPConnectionError" and "'web'" in first.error.message
    assert elapsed < 5
    assert second.error is None, second.error
    assert [m["content"] for m in second.completion if m["role"] == "tool"] == ["3", "sent"]


# --- closing -----------------------------------------------------------------------------------


async def test_aclose_leaves_nothing_and_the_env_is_usable_again(no_leaks: None) -> None:
    before = children()
    env = env_for(stdio())
    async with FakeOpenAIServer(scripted([call("pid", {}, "c0")])) as server, client_for(server) as client:
        [first] = await env.run(client)
        assert len(children() - before) == 1
        started = time.perf_counter()
        await env.aclose()
        close_time = time.perf_counter() - started
        await env.aclose()  # idempotent
        assert children() - before == set() and not env.is_connected("calc")
        [second] = await env.run(client)  # reconnects
        await env.aclose()
    print(f"aclose of a stdio server: {close_time:.2f} s")
    assert first.error is None and second.error is None
    assert pid_of(first) != pid_of(second)
    assert not alive(pid_of(first)) and not alive(pid_of(second))


async def test_cancelled_run_then_aclose_leaks_nothing(
    transport: str, maybe_http: HTTPServer | None, no_leaks: None
) -> None:
    in_flight = asyncio.Event()

    def reply(body: dict[str, Any]) -> Any:
        if turn_of(body) == 0:
            return {"content": None, "tool_calls": [call("pid", {}, "c0")]}
        if turn_of(body) == 1:
            asyncio.get_running_loop().call_later(0.3, in_flight.set)
            return {"content": None, "tool_calls": [call("sleep", {"seconds": 30}, "c1")]}
        return "done"

    env = env_for(server_for(transport, maybe_http))
    async with FakeOpenAIServer(reply) as server, client_for(server) as client:
        run = asyncio.create_task(env.run(client, pa.RunSpec(rollouts_per_example=2)))
        await asyncio.wait_for(in_flight.wait(), 10)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await env.aclose()
        await env.aclose()
    assert leftover_tasks() == []


async def test_a_cancelled_connect_is_reused_or_closed(no_leaks: None) -> None:
    env = env_for(stdio())
    connecting = asyncio.create_task(env.connect())
    await asyncio.sleep(0.1)
    connecting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await connecting
    await eventually(lambda: env._conns["calc"].ready.done())  # connected, tools not registered yet
    assert not env.is_connected("calc")
    await env.connect()  # takes the connection the cancelled call made
    assert env.is_connected("calc") and "add" in env.tool_map
    await env.aclose()
    assert not env.is_connected("calc")
    connecting = asyncio.create_task(env.connect())
    await asyncio.sleep(0.1)
    connecting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await connecting
    await env.aclose()  # a connection still starting is cut short


# --- configuration -----------------------------------------------------------------------------


def test_server_config_is_checked() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        MCPServer("x")
    with pytest.raises(ValueError, match="exactly one"):
        MCPServer("x", command="a", url="http://h/mcp")
    with pytest.raises(ValueError, match="must match"):
        MCPServer("bad name", command="a")
    with pytest.raises(ValueError, match="headers are for a url"):
        MCPServer("x", command="a", headers={"a": "b"})
    with pytest.raises(ValueError, match="args, env and cwd"):
        MCPServer("x", url="http://h/mcp", args=["-v"])
    with pytest.raises(ValueError, match="http://"):
        MCPServer("x", url="ftp://h")
    with pytest.raises(ValueError, match="timeout"):
        MCPServer("x", command="a", timeout=0)
    with pytest.raises(ValueError, match="not one string"):
        MCPServer("x", command="a", args="-v")
    server = MCPServer("x", command="a", args=["-v"], env={"K": 1})  # type: ignore[dict-item]
    assert server.args == ("-v",) and server.env == {"K": "1"} and server.transport == "stdio"


def test_mcp_servers_style_configs() -> None:
    config = {
        "mcpServers": {
            "files": {"command": "npx", "args": ["-y", "server-files"], "env": {"ROOT": "/tmp"}},
            "search": {"type": "streamable-http", "url": "https://example.com/mcp", "headers": {"A": "b"}},
        }
    }
    files, search = parse_servers(config)
    assert files == MCPServer("files", command="npx", args=("-y", "server-files"), env={"ROOT": "/tmp"})
    assert search.url == "https://example.com/mcp" and search.transport == "http"
    assert parse_servers([{"name": "s", "url": "http://h/mcp", "timeout": 5}])[0].timeout == 5
    with pytest.raises(ValueError, match="not supported"):
        parse_servers({"old": {"type": "sse", "url": "http://h/sse"}})
    with pytest.raises(ValueError, match="unknown keys"):
        parse_servers({"s": {"command": "a", "arg": []}})
    with pytest.raises(ValueError, match="share a name"):
        parse_servers([MCPServer("s", command="a"), {"name": "s", "command": "b"}])
    with pytest.raises(ValueError, match="at least one"):
        parse_servers([])
    env = MCPEnv(config, dataset=[{"question": "q"}], system_prompt="Use the tools.", max_turns=3)
    assert env.prefix_tools and env.max_turns == 3 and env.tools is None
