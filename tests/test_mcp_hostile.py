"""MCPEnv against servers that misbehave: never answer, answer something that is not MCP, or
answer too much. Each costs the rollout (stage ``tool``), never the run, and one log line."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("mcp")

from test_mcp_env import SERVER, HTTPServer, call, children, client_for, leftover_tasks, scripted

import palaestra as pa
from palaestra.envs.mcp import MCPConnectionError, MCPEnv, MCPServer
from palaestra.envs.mcp_guard import GuardedStream, LogScope
from palaestra.testing import FakeOpenAIServer
from palaestra.tools import DEFAULT_MAX_RESULT_CHARS

pytestmark = pytest.mark.filterwarnings(
    "error::ResourceWarning", "error::pytest.PytestUnraisableExceptionWarning", "error::RuntimeWarning"
)


@pytest.fixture
async def no_leaks() -> AsyncIterator[None]:
    before = children()
    yield
    assert children() - before == set()
    assert leftover_tasks() == []


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def hostile(transport: str, mode: str, servers: list[HTTPServer], **options: Any) -> MCPServer:
    """The test server misbehaving as ``mode`` says, over ``transport``."""
    if transport == "stdio":
        return MCPServer("bad", command=SERVER[0], args=[*SERVER[1:], "--misbehave", mode], **options)
    http = HTTPServer("--misbehave", mode)
    http.start()
    servers.append(http)
    return MCPServer("bad", url=http.url, **options)


@pytest.fixture
def http_servers() -> Iterator[list[HTTPServer]]:
    started: list[HTTPServer] = []
    yield started
    for server in started:
        server.stop()


def sdk_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "mcp" or r.name.startswith("mcp.")]


def two_rows() -> list[dict[str, Any]]:
    return [{"question": "first"}, {"question": "second"}]


async def test_a_server_that_never_answers_fails_within_connect_timeout(
    transport: str, http_servers: list[HTTPServer], no_leaks: None
) -> None:
    env = MCPEnv(hostile(transport, "silent", http_servers, connect_timeout=0.5), dataset=two_rows())
    async with env, FakeOpenAIServer(scripted([])) as fake, client_for(fake) as client:
        start = time.perf_counter()
        rollouts = await env.run(client, pa.RunSpec(max_concurrent=1))
        elapsed = time.perf_counter() - start
    for rollout in rollouts:  # each rollout tried again, and failed on its own
        assert rollout.error is not None and rollout.error.stage == "tool"
        assert rollout.error.type == "MCPConnectionError"
        assert "'bad'" in rollout.error.message and "timed out after 0.5 s" in rollout.error.message
    assert elapsed < 5 and fake.request_count == 0


async def test_a_server_that_sends_what_is_not_mcp_is_dead_at_once_and_logged_once(
    transport: str, http_servers: list[HTTPServer], caplog: pytest.LogCaptureFixture, no_leaks: None
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcp")
    env = MCPEnv(hostile(transport, "garbage", http_servers, connect_timeout=30), dataset=two_rows())
    async with env, FakeOpenAIServer(scripted([])) as fake, client_for(fake) as client:
        start = time.perf_counter()
        rollouts = await env.run(client, pa.RunSpec(max_concurrent=1))
        elapsed = time.perf_counter() - start
    for rollout in rollouts:
        assert rollout.error is not None and rollout.error.stage == "tool"
        assert "MCPProtocolError: it sent something that is not an MCP message" in rollout.error.message
    assert elapsed < 8  # not the 30 s connect timeout, twice
    records = sdk_records(caplog)
    assert records, "the SDK's complaint is kept, condensed"
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in records)
    assert all(r.getMessage().startswith("MCP server 'bad': ") for r in records)
    assert len({(r.pathname, r.lineno) for r in records}) == len(records) <= 3  # one line per problem


async def test_a_server_that_breaks_the_protocol_mid_rollout_ends_it_and_the_next_reconnects(
    transport: str, caplog: pytest.LogCaptureFixture, no_leaks: None
) -> None:
    http = HTTPServer() if transport == "http" else None
    if http is not None:
        http.start()
    try:
        server = (
            MCPServer("calc", url=http.url) if http else MCPServer("calc", command=SERVER[0], args=SERVER[1:])
        )
        rows = [{"prompt": [{"role": "user", "content": "garble"}]}, {"question": "add"}]

        def reply(body: dict[str, Any]) -> Any:
            if any(m["role"] == "assistant" for m in body["messages"]):
                return "done"
            name = "garble" if body["messages"][0]["content"] == "garble" else "add"
            return {
                "content": None,
                "tool_calls": [call(name, {"a": 1, "b": 2} if name == "add" else {}, "c0")],
            }

        env = MCPEnv(server, dataset=rows)
        async with env, FakeOpenAIServer(reply) as fake, client_for(fake) as client:
            start = time.perf_counter()
            broken = await env.rollout(client, env.examples[0])
            elapsed = time.perf_counter() - start
            fine = await env.rollout(client, env.examples[1])
    finally:
        if http is not None:
            http.stop()
    assert broken.error is not None and broken.error.stage == "tool", broken.error
    assert broken.error.type == "MCPProtocolError" and "'calc'" in broken.error.message
    assert "is dropped: it sent something that is not an MCP message" in broken.error.message
    assert elapsed < 5  # not the call's 60 s timeout
    assert fine.error is None and [m["content"] for m in fine.completion if m["role"] == "tool"] == ["3"]
    assert all(r.exc_info is None for r in sdk_records(caplog))


async def test_mcp_results_are_capped_by_the_environment_or_the_server(no_leaks: None) -> None:
    turn = [call("big", {"chars": 100_000}, "c0"), call("picture", {}, "c1")]
    plain = MCPServer("calc", command=SERVER[0], args=SERVER[1:])
    capped = MCPServer("calc", command=SERVER[0], args=SERVER[1:], max_result_chars=50)
    texts = []
    for server in (plain, capped):
        env = MCPEnv(server, dataset=[{"question": "q"}])
        async with env, FakeOpenAIServer(scripted(turn)) as fake, client_for(fake) as client:
            [rollout] = await env.run(client)
        assert rollout.error is None
        texts.append([m["content"] for m in rollout.completion if m["role"] == "tool"])
    (big, picture), (small, _) = texts
    assert big.startswith("x" * DEFAULT_MAX_RESULT_CHARS + "\n[... 80,000 more characters cut")
    assert (
        small
        == "x" * 50 + "\n[... 99,950 more characters cut: the result had 100,000, the first 50 are shown]"
    )
    assert picture == "[image: image/png]"  # no image bytes reach the model


def test_tools_no_model_api_takes_refuse_the_server() -> None:
    env = MCPEnv(MCPServer("odd", command="unused"), dataset=[{"question": "q"}])
    for info in (
        SimpleNamespace(name="list", input_schema={"type": "array"}, description="", title=None),
        SimpleNamespace(name="", input_schema={}, description="", title=None),
    ):
        conn = SimpleNamespace(server=env.servers[0], tools=[info], logs=LogScope("odd"))
        with pytest.raises(MCPConnectionError, match="MCP server 'odd': its tool"):
            env._register(conn)  # type: ignore[arg-type]  # only the fields _register reads
    assert env.tool_map == {} and env.tools is None


async def test_the_guard_skips_blank_lines_and_ends_the_stream_at_the_first_non_message() -> None:
    import anyio
    from mcp.shared.message import SessionMessage
    from mcp_types import jsonrpc_message_adapter

    def item(line: str) -> Any:  # what the stdio transport hands on for a line
        try:
            return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:
            return exc

    send, receive = anyio.create_memory_object_stream[Any](10)
    problems: list[str] = []
    lines = [
        "",
        "  \r",
        '{"jsonrpc": "2.0", "method": "notifications/a"}',
        "garbage",
        '{"jsonrpc": "2.0", "method": "b"}',
    ]
    for line in lines:
        await send.send(item(line))
    async with GuardedStream(receive, problems.append) as guard:
        got = [message async for message in guard]
    await send.aclose()
    assert [m.message.method for m in got] == ["notifications/a"]  # the one after the garbage is not read
    assert len(problems) == 1 and problems[0].startswith("it sent something that is not an MCP message: ")
    assert "'garbage'" in problems[0]
