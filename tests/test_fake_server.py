"""The fake OpenAI server, driven over loopback HTTP by the official SDK and by raw aiohttp."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from palaestra.testing import FakeOpenAIServer, FaultPlan, fixed_reply

REPO_ROOT = Path(__file__).resolve().parents[1]
USER = [{"role": "user", "content": "hello there world"}]


def sdk(server: FakeOpenAIServer, api_key: str = "x", **options: Any) -> openai.AsyncOpenAI:
    """An SDK client for the server; use it in ``async with`` so it closes on the test's loop."""
    options.setdefault("max_retries", 0)
    return openai.AsyncOpenAI(base_url=server.base_url, api_key=api_key, **options)


async def ask(server: FakeOpenAIServer, messages: list[Any] = USER, **create: Any) -> Any:
    """One chat completion through the official SDK (no retries unless ``max_retries``)."""
    options = {k: create.pop(k) for k in ("api_key", "timeout", "max_retries") if k in create}
    create.setdefault("model", "fake-model")
    async with sdk(server, **options) as client:
        return await client.chat.completions.create(messages=messages, **create)


async def post(server: FakeOpenAIServer, body: Any, **headers: str) -> tuple[int, Any]:
    """POST raw bytes (or a JSON-encoded object) to chat/completions; returns (status, JSON)."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with aiohttp.ClientSession() as session:
        url = f"{server.base_url}/chat/completions"
        async with session.post(url, data=data, headers=headers) as resp:
            return resp.status, orjson.loads(await resp.read())


def chat(content: str = "hello there world", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], **extra}


@pytest.mark.asyncio
async def test_echo_round_trip_with_the_sdk() -> None:
    async with FakeOpenAIServer() as server:
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1" and server.port > 0
        messages = [{"role": "system", "content": "be brief"}, *USER]
        resp = await ask(server, messages)
    assert resp.object == "chat.completion"
    assert resp.model == "fake-model"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == "hello there world"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].logprobs is None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (5, 3)
    assert resp.usage.total_tokens == 8
    assert server.request_count == 1
    assert server.requests[0]["messages"] == messages


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_custom_reply_function_sees_the_request(kind: str) -> None:
    def shout(body: dict[str, Any]) -> str:
        return f"{body['messages'][-1]['content'].upper()} t={body.get('temperature')}"

    async def shout_async(body: dict[str, Any]) -> str:
        await asyncio.sleep(0)
        return shout(body)

    async with FakeOpenAIServer(shout if kind == "sync" else shout_async) as server:
        resp = await ask(server, temperature=0.5)
    assert resp.choices[0].message.content == "HELLO THERE WORLD t=0.5"


@pytest.mark.asyncio
async def test_tool_calls_pass_through() -> None:
    call = {"id": "call_7", "function": {"name": "move", "arguments": {"square": 4}}}
    async with FakeOpenAIServer(lambda body: {"content": None, "tool_calls": [call]}) as server:
        resp = await ask(server)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [tool_call] = choice.message.tool_calls
    assert (tool_call.id, tool_call.type, tool_call.function.name) == ("call_7", "function", "move")
    assert orjson.loads(tool_call.function.arguments) == {"square": 4}
    assert resp.usage.completion_tokens == 2  # the name, then '{"square":4}' as one word
    assert call == {"id": "call_7", "function": {"name": "move", "arguments": {"square": 4}}}


@pytest.mark.asyncio
async def test_logprobs_and_token_ids_are_deterministic() -> None:
    async with FakeOpenAIServer(fixed_reply("one two one")) as server:
        status, first = await post(server, chat(logprobs=True, return_token_ids=True))
        _, second = await post(server, chat(logprobs=True, return_token_ids=True))
        _, ids_only = await post(server, chat(return_token_ids=True))
    assert status == 200 and first["choices"] == second["choices"]
    choice = first["choices"][0]
    ids = choice["token_ids"]
    assert len(ids) == 3 == first["usage"]["completion_tokens"]
    assert ids[0] == ids[2] != ids[1] and all(0 <= i < 50_000 for i in ids)
    entries = choice["logprobs"]["content"]
    assert [e["token"] for e in entries] == [f"token_id:{i}" for i in ids]
    assert all(e["logprob"] < 0 and e["bytes"] is None and e["top_logprobs"] == [] for e in entries)
    assert ids_only["choices"][0]["token_ids"] == ids
    assert ids_only["choices"][0]["logprobs"] is None
    assert len(ids_only["prompt_token_ids"]) == 3


@pytest.mark.asyncio
async def test_max_tokens_truncates_with_finish_reason_length() -> None:
    async with FakeOpenAIServer(fixed_reply("a b c d e f")) as server:
        cut = await ask(server, max_tokens=4)
        whole = await ask(server, max_tokens=6)
    assert cut.choices[0].message.content == "a b c d"
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage.completion_tokens == 4
    assert whole.choices[0].finish_reason == "stop"


@pytest.mark.asyncio
async def test_models_endpoint_lists_the_one_model() -> None:
    async with FakeOpenAIServer(model="tiny") as server:
        async with sdk(server) as client:
            page = await client.models.list()
    assert [m.id for m in page.data] == ["tiny"]
    assert page.data[0].object == "model"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        {"model": "fake-model"},
        {"model": "fake-model", "messages": "hi"},
        {"model": "fake-model", "messages": []},
        {"model": "fake-model", "messages": ["hi"]},
        {"messages": USER},
    ],
)
async def test_malformed_bodies_get_openai_400(body: Any) -> None:
    async with FakeOpenAIServer() as server:
        status, payload = await post(server, body)
        assert server.request_count == 0
    assert status == 400
    error = payload["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] and set(error) == {"message", "type", "param", "code"}


@pytest.mark.asyncio
async def test_unknown_model_is_404_and_streaming_works_as_in_palaestra_serve() -> None:
    async with FakeOpenAIServer() as server:
        with pytest.raises(openai.NotFoundError) as missing:
            await ask(server, model="gpt-9")
        stream = await ask(server, stream=True)
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert missing.value.code == "model_not_found" and "gpt-9" in missing.value.message
    assert streamed == "hello there world"  # the fake is the real server: it streams like it


@pytest.mark.asyncio
async def test_api_key_is_enforced() -> None:
    async with FakeOpenAIServer(api_key="sekret") as server:
        with pytest.raises(openai.AuthenticationError):
            await ask(server, api_key="nope")
        async with sdk(server, api_key="nope") as wrong:
            with pytest.raises(openai.AuthenticationError):
                await wrong.models.list()
        status, _ = await post(server, chat())
        resp = await ask(server, api_key="sekret")
    assert status == 401
    assert resp.choices[0].message.content == "hello there world"


@pytest.mark.asyncio
async def test_status_faults_reach_the_client_as_status_errors() -> None:
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][-1]["content"] == "limit":
            return {"fault": "status", "status": 429, "retry_after": 7}
        return {"fault": "status", "status": 503}

    async with FakeOpenAIServer(reply) as server:
        with pytest.raises(openai.RateLimitError) as limited:
            await ask(server, [{"role": "user", "content": "limit"}])
        with pytest.raises(openai.InternalServerError) as unavailable:
            await ask(server)
    assert limited.value.response.headers["retry-after"] == "7"
    assert limited.value.type == "rate_limit_error"
    assert unavailable.value.status_code == 503


@pytest.mark.asyncio
async def test_close_fault_drops_the_connection() -> None:
    async with FakeOpenAIServer(lambda body: {"fault": "close"}) as server:
        with pytest.raises(openai.APIConnectionError) as dropped:
            await ask(server)
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await post(server, chat())
    assert not isinstance(dropped.value, openai.APITimeoutError)


@pytest.mark.asyncio
async def test_hang_fault_trips_the_client_timeout_and_stop_is_prompt() -> None:
    server = FakeOpenAIServer(lambda body: {"fault": "hang"})
    await server.start()
    with pytest.raises(openai.APITimeoutError):
        await ask(server, timeout=0.3)
    # A request still hanging when the server stops is dropped, not left waiting forever.
    pending = asyncio.ensure_future(post(server, chat()))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await server.stop()
    assert time.monotonic() - started < 0.3  # not aiohttp's 0.5 s shutdown grace
    with pytest.raises(aiohttp.ClientConnectionError):
        await asyncio.wait_for(pending, 2)


@pytest.mark.asyncio
async def test_hang_with_seconds_then_answers() -> None:
    async with FakeOpenAIServer(lambda b: {"fault": "hang", "seconds": 0.3, "reply": "late"}) as s:
        started = time.monotonic()
        resp = await ask(s)
    assert time.monotonic() - started >= 0.3
    assert resp.choices[0].message.content == "late"


@pytest.mark.asyncio
async def test_malformed_and_bad_shape_faults_are_200s_clients_cannot_use() -> None:
    plan = FaultPlan([{"fault": "malformed"}, {"fault": "bad_shape"}, {"fault": "malformed"}])
    async with FakeOpenAIServer(faults=plan) as server, aiohttp.ClientSession() as session:
        url = f"{server.base_url}/chat/completions"
        async with session.post(url, json=chat()) as resp:
            broken_status, broken_type = resp.status, resp.content_type
            broken = await resp.read()
        async with session.post(url, json=chat()) as resp:
            shape_status, shape = resp.status, orjson.loads(await resp.read())
        with pytest.raises(ValueError):  # the SDK fails to decode the body
            await ask(server)
    assert (broken_status, broken_type) == (200, "application/json")
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(broken)
    assert shape_status == 200 and "choices" not in shape and shape["object"] == "chat.completion"


@pytest.mark.asyncio
@pytest.mark.parametrize("cycle", [True, False])
async def test_fault_plan_schedules_by_request_number(cycle: bool) -> None:
    plan = FaultPlan([None, None, {"fault": "status", "status": 500}], cycle=cycle)
    async with FakeOpenAIServer(faults=plan) as server:
        statuses = [(await post(server, chat(f"m{i}")))[0] for i in range(7)]
    if cycle:
        assert statuses == [200, 200, 500, 200, 200, 500, 200]
    else:
        assert statuses == [200, 200, 500, 200, 200, 200, 200]


@pytest.mark.asyncio
async def test_attempts_fail_each_conversation_twice_then_succeed() -> None:
    plan = FaultPlan([{"fault": "status", "status": 500, "attempts": 2, "retry_after": 0.01}])
    async with FakeOpenAIServer(faults=plan) as server:
        a = [(await post(server, chat("conversation a")))[0] for _ in range(3)]
        b = [(await post(server, chat("conversation b")))[0] for _ in range(3)]
        # The SDK's own retries (two of them) see the same message list, so the third try wins.
        resp = await ask(server, max_retries=2)
        with pytest.raises(openai.InternalServerError):
            await ask(server, [{"role": "user", "content": "fresh"}], max_retries=1)
    assert a == b == [500, 500, 200]
    assert resp.choices[0].message.content == "hello there world"
    assert server.request_count == 6 + 3 + 2
    assert sorted(server.attempts.values()) == [2, 3, 3, 3]


@pytest.mark.asyncio
async def test_reply_directive_attempts_fall_back_to_its_reply() -> None:
    async with FakeOpenAIServer(lambda b: {"fault": "close", "attempts": 1, "reply": "ok"}) as s:
        with pytest.raises(openai.APIConnectionError):
            await ask(s)
        resp = await ask(s)
    assert resp.choices[0].message.content == "ok"


@pytest.mark.asyncio
async def test_bad_directives_and_reply_errors_are_reported() -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        FaultPlan([{"fault": "explode"}])

    def reply(body: dict[str, Any]) -> Any:
        if body["messages"][-1]["content"] == "raise":
            raise KeyError("oops")
        return {"fault": "explode"}

    async with FakeOpenAIServer(reply) as server:
        raised = await post(server, chat("raise"))
        unknown = await post(server, chat("other"))
    assert raised[0] == 500 and "KeyError" in raised[1]["error"]["message"]
    assert unknown[0] == 500 and "explode" in unknown[1]["error"]["message"]


@pytest.mark.asyncio
async def test_standalone_process_serves_until_sigterm() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *sys.path])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "palaestra.testing.server",
        "--port",
        "0",
        "--reply",
        "reverse",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 15)).decode().strip()
        assert line.startswith("READY http://127.0.0.1:") and line.endswith("/v1")
        async with openai.AsyncOpenAI(base_url=line.split()[1], api_key="x") as client:
            resp = await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "abc"}]
            )
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 5)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert resp.choices[0].message.content == "<reversed_text>cba</reversed_text>"
    assert code == 0
    assert await proc.stderr.read() == b""  # no traceback, no double-import warning
