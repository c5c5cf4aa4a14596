"""`palaestra serve`: the OpenAI-compatible server over a ModelClient, driven by the official
openai SDK (and palaestra's own OpenAIClient) over real loopback HTTP."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import pytest_asyncio

import palaestra as pa
from palaestra.serve import running, serve

shared_server = pytest.mark.asyncio(loop_scope="module")  # tests using the module's one server

MODEL = "test-model"
USER = [{"role": "user", "content": "hello there"}]


class Recorder:
    """A deterministic policy that records the Sampling it saw; the last user message steers it.

    "boom" raises RuntimeError, "refuse" ValueError, "sleep" waits 0.2 s, "tool" calls a tool; otherwise it answers
    ``You said: <text>`` with one token per word (ids = word lengths), cut at ``max_tokens``.
    """

    def __init__(self) -> None:
        self.seen: list[tuple[pa.Sampling, list[dict[str, Any]] | None]] = []

    async def __call__(self, messages: pa.Messages, sampling: pa.Sampling, tools: Any) -> Any:
        self.seen.append((sampling, tools))
        text = messages[-1]["content"]
        if text == "boom":
            raise RuntimeError("boom")
        if text == "refuse":
            raise ValueError("this backend cannot do that")
        if text == "sleep":
            await asyncio.sleep(0.2)
        if text == "tool":
            call = {"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
            return {"content": None, "tool_calls": [call]}
        words = f"You said: {text}".split(" ")
        finish = "stop"
        if sampling.max_tokens is not None and len(words) > sampling.max_tokens:
            words, finish = words[: sampling.max_tokens], "length"
        return pa.ModelResponse(
            message={"role": "assistant", "content": " ".join(words)},
            finish_reason=finish,
            usage=pa.Usage(prompt_tokens=11, completion_tokens=len(words)),
            token_ids=[len(w) for w in words],
            logprobs=[-0.25 * (i + 1) for i in range(len(words))] if sampling.logprobs else None,
        )


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def base_url(recorder: Recorder) -> AsyncIterator[str]:
    async with running(pa.ScriptedClient(recorder, model=MODEL)) as url:
        yield url


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sdk(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
        yield client


@shared_server
async def test_models_lists_the_served_model(sdk: openai.AsyncOpenAI) -> None:
    models = await sdk.models.list()
    assert [m.id for m in models.data] == [MODEL]


@shared_server
async def test_chat_completion(sdk: openai.AsyncOpenAI) -> None:
    reply = await sdk.chat.completions.create(model=MODEL, messages=USER)
    assert reply.object == "chat.completion" and reply.model == MODEL and reply.id.startswith("chatcmpl-")
    assert reply.choices[0].message.content == "You said: hello there"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].logprobs is None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (11, 4, 15)
    assert "token_ids" not in reply.choices[0].model_dump()


@shared_server
async def test_sampling_parameters_reach_the_client(sdk: openai.AsyncOpenAI, recorder: Recorder) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    reply = await sdk.chat.completions.create(
        model=MODEL,
        messages=USER,
        temperature=0.3,
        top_p=0.9,
        max_tokens=2,
        stop="END",
        seed=5,
        tools=tools,  # a minimal tool schema is enough here
        user="someone",  # metadata and OpenAI defaults are not passed on
        tool_choice="auto",
        frequency_penalty=0,
        extra_body={"top_k": 20, "min_p": 0.1, "repetition_penalty": None},
    )
    sampling, seen_tools = recorder.seen[-1]
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens) == (0.3, 0.9, 2)
    assert (sampling.stop, sampling.seed, sampling.logprobs) == (["END"], 5, False)
    assert sampling.extra == {"top_k": 20, "min_p": 0.1}
    assert seen_tools == tools
    assert reply.choices[0].message.content == "You said:"
    assert reply.choices[0].finish_reason == "length"

    await sdk.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_completion_tokens=3,
        stop=["a", "b"],
        tool_choice="none",
        presence_penalty=0.5,
    )
    sampling, seen_tools = recorder.seen[-1]
    assert sampling.extra == {"tool_choice": "none", "presence_penalty": 0.5}
    assert (sampling.max_tokens, sampling.stop, sampling.temperature, seen_tools) == (
        3,
        ["a", "b"],
        None,
        None,
    )


@shared_server
async def test_logprobs_and_token_ids(sdk: openai.AsyncOpenAI, recorder: Recorder) -> None:
    reply = await sdk.chat.completions.create(
        model=MODEL, messages=USER, logprobs=True, top_logprobs=0, extra_body={"return_token_ids": True}
    )
    assert recorder.seen[-1][0].logprobs is True
    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert [(t.token, t.logprob, t.bytes, t.top_logprobs) for t in choice.logprobs.content] == [
        ("token_id:3", -0.25, None, []),
        ("token_id:5", -0.5, None, []),
        ("token_id:5", -0.75, None, []),
        ("token_id:5", -1.0, None, []),
    ]
    assert choice.model_dump()["token_ids"] == [3, 5, 5, 5]

    # palaestra's own client reads both back, as it does from vLLM
    client = pa.OpenAIClient(MODEL, base_url=str(sdk.base_url))
    async with client:
        response = await client.chat(USER, sampling=pa.Sampling(logprobs=True))
    assert response.token_ids == [3, 5, 5, 5] and response.logprobs == [-0.25, -0.5, -0.75, -1.0]


@shared_server
async def test_logprob_tokens_are_text_with_a_tokenizer(recorder: Recorder) -> None:
    class Letters:
        def decode(self, ids: list[int]) -> str:
            return "".join("abcdefgh"[i] for i in ids)

    class TokenizingClient(pa.ScriptedClient):
        tokenizer = Letters()  # picked up by the server, as a LocalClient's tokenizer would be

    async with (
        running(TokenizingClient(recorder, model=MODEL)) as url,
        openai.AsyncOpenAI(base_url=url, api_key="x") as sdk,
    ):
        reply = await sdk.chat.completions.create(model=MODEL, messages=USER, logprobs=True)
    content = reply.choices[0].logprobs.content
    assert [(t.token, t.bytes) for t in content] == [("d", [100]), ("f", [102]), ("f", [102]), ("f", [102])]


@shared_server
async def test_streaming_replays_the_reply(sdk: openai.AsyncOpenAI) -> None:
    text = "  several words,\nwith   odd spacing  "
    messages = [{"role": "user", "content": text}]
    args: dict[str, Any] = {"logprobs": True, "extra_body": {"return_token_ids": True}}
    whole = await sdk.chat.completions.create(model=MODEL, messages=messages, **args)
    stream = await sdk.chat.completions.create(
        model=MODEL,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        **args,
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3  # really chunked
    *body, last, usage = chunks
    assert [c.choices[0].finish_reason for c in body] == [None] * len(body)
    assert last.choices[0].finish_reason == "stop"
    assert last.choices[0].logprobs.model_dump() == whole.choices[0].logprobs.model_dump()
    assert last.choices[0].model_dump()["token_ids"] == whole.choices[0].model_dump()["token_ids"]
    assert usage.choices == [] and usage.usage == whole.usage


@shared_server
async def test_stream_ends_with_done_and_carries_tool_calls(base_url: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "tool"}], "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base_url}/chat/completions", json=body) as resp:
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            raw = (await resp.read()).decode()
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    calls = [
        c["choices"][0]["delta"]["tool_calls"] for c in chunks if "tool_calls" in c["choices"][0]["delta"]
    ]
    function = {"name": "add", "arguments": '{"a":1,"b":2}'}
    assert calls == [[{"index": 0, "id": "call_0", "type": "function", "function": function}]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@shared_server
async def test_tool_calls(sdk: openai.AsyncOpenAI) -> None:
    reply = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "tool"}])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("call_0", "add", '{"a":1,"b":2}')


BAD_REQUESTS: list[tuple[dict[str, Any], type[openai.APIStatusError], str]] = [
    ({"model": "other-model"}, openai.NotFoundError, "`other-model` does not exist"),
    ({"messages": []}, openai.BadRequestError, "non-empty list"),
    ({"messages": "hello"}, openai.BadRequestError, "non-empty list"),
    ({"messages": [{"content": "hi"}]}, openai.BadRequestError, r"messages\[0\]: 'role' must be one of"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, openai.BadRequestError, "'role' must be"),
    ({"messages": [{"role": "user"}]}, openai.BadRequestError, "needs 'content'"),
    ({"messages": [{"role": "user", "content": 3}]}, openai.BadRequestError, "'content' must be"),
    ({"max_tokens": 0}, openai.BadRequestError, "'max_tokens' must be at least 1"),
    ({"max_completion_tokens": -5}, openai.BadRequestError, "'max_completion_tokens' must be at least 1"),
    ({"max_tokens": "ten"}, openai.BadRequestError, "'max_tokens' must be an integer"),
    ({"temperature": "hot"}, openai.BadRequestError, "'temperature' must be a number"),
    ({"temperature": -1}, openai.BadRequestError, "'temperature' must be >= 0"),
    ({"top_p": 1.5}, openai.BadRequestError, "'top_p' must be in"),
    ({"stop": [1]}, openai.BadRequestError, "'stop' must be a string or a list"),
    ({"seed": 1.5}, openai.BadRequestError, "'seed' must be an integer"),
    ({"logprobs": "yes"}, openai.BadRequestError, "'logprobs' must be a boolean"),
    ({"n": 2}, openai.BadRequestError, "'n' must be 1"),
    ({"logprobs": True, "top_logprobs": 3}, openai.BadRequestError, "'top_logprobs' must be 0"),
    ({"tools": ["add"]}, openai.BadRequestError, r"tools\[0\]: each tool must be an object"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, openai.BadRequestError, "must match"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
        openai.BadRequestError,
        "invalid schema for function 'f'",
    ),
]


@shared_server
@pytest.mark.parametrize(("change", "error", "message"), BAD_REQUESTS)
async def test_bad_requests_get_openai_errors(
    sdk: openai.AsyncOpenAI,
    recorder: Recorder,
    change: dict[str, Any],
    error: type[openai.APIStatusError],
    message: str,
) -> None:
    args: dict[str, Any] = {"model": MODEL, "messages": USER, **change}
    calls = len(recorder.seen)
    with pytest.raises(error, match=message) as caught:
        await sdk.chat.completions.create(**args)
    assert caught.value.body["type"] == "invalid_request_error"
    assert caught.value.body["param"] is not None
    assert len(recorder.seen) == calls  # the client was never called


@shared_server
async def test_malformed_bodies_and_unknown_routes(base_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for data in (b"{not json", b"[1, 2]"):
            async with session.post(f"{base_url}/chat/completions", data=data) as resp:
                error = (await resp.json())["error"]
                assert resp.status == 400 and error["type"] == "invalid_request_error"
        async with session.get(f"{base_url}/completions") as resp:
            assert resp.status == 404 and "Not Found" in (await resp.json())["error"]["message"]
        async with session.get(f"{base_url}/chat/completions") as resp:
            assert resp.status == 405 and "error" in await resp.json()


@shared_server
async def test_a_failing_client_is_an_error_and_the_server_goes_on(sdk: openai.AsyncOpenAI) -> None:
    boom = [{"role": "user", "content": "boom"}]
    with pytest.raises(openai.InternalServerError, match="RuntimeError: boom") as caught:
        await sdk.chat.completions.create(model=MODEL, messages=boom)
    assert caught.value.status_code == 500 and caught.value.body["type"] == "server_error"
    with pytest.raises(openai.InternalServerError):  # a streamed request fails before the stream
        await sdk.chat.completions.create(model=MODEL, messages=boom, stream=True)
    refuse = [{"role": "user", "content": "refuse"}]
    with pytest.raises(openai.BadRequestError, match="refused the request: ValueError: this backend cannot"):
        await sdk.chat.completions.create(model=MODEL, messages=refuse)
    reply = await sdk.chat.completions.create(model=MODEL, messages=USER)
    assert reply.choices[0].message.content == "You said: hello there"


@shared_server
async def test_requests_are_served_concurrently(sdk: openai.AsyncOpenAI) -> None:
    sleep = [{"role": "user", "content": "sleep"}]
    start = time.perf_counter()
    replies = await asyncio.gather(
        *(sdk.chat.completions.create(model=MODEL, messages=sleep) for _ in range(10))
    )
    assert time.perf_counter() - start < 1.0  # serialised, 10 × 0.2 s would take 2 s
    assert {r.choices[0].message.content for r in replies} == {"You said: sleep"}


@pytest.mark.parametrize("transport", ["aiohttp", "openai"])
async def test_palaestra_eval_runs_over_the_server(transport: str) -> None:
    """What `palaestra eval -m NAME -b URL` does: OpenAIClient against the served model."""

    def answer(messages: pa.Messages) -> str:
        return str(sum(int(n) for n in re.findall(r"\d+", messages[-1]["content"])))

    def correct(completion: pa.Messages, answer: str) -> float:
        return float(completion[-1]["content"] == answer)

    rows = [{"question": f"What is {i} + {i + 2}?", "answer": str(2 * i + 2)} for i in range(6)]
    env = pa.SingleTurnEnv(dataset=rows, system_prompt="Add.", rubric=pa.Rubric([correct]))
    async with running(pa.ScriptedClient(answer, model="adder")) as url:
        async with pa.OpenAIClient("adder", base_url=url, transport=transport) as client:
            rollouts = await env.run(client, pa.RunSpec(rollouts_per_example=2, max_concurrent=4, seed=1))
    assert len(rollouts) == 12 and all(r.error is None for r in rollouts)
    assert [r.reward for r in rollouts] == [1.0] * 12
    assert all(r.usage.completion_tokens == 1 for r in rollouts)


def test_serve_prints_its_address_answers_and_stops_on_ctrl_c() -> None:
    code = (
        "import palaestra as pa; from palaestra.serve import serve; "
        "serve(pa.ScriptedClient(lambda: 'pong', model='pinger'), port=0, model_name='served-name')"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env) as proc:
        pool = ThreadPoolExecutor(1)  # a server that never starts fails the test instead of hanging it
        try:
            assert proc.stdout is not None
            line = pool.submit(proc.stdout.readline).result(timeout=30)
            match = re.fullmatch(r"serving served-name at (http://127\.0\.0\.1:(\d+)/v1)\n", line)
            assert match is not None and int(match[2]) > 0, line
            with openai.OpenAI(base_url=match[1], api_key="x", max_retries=0) as sdk:
                reply = sdk.chat.completions.create(model="served-name", messages=USER)
            assert reply.choices[0].message.content == "pong"
            proc.send_signal(signal.SIGINT)  # Ctrl-C: a clean shutdown
            assert proc.wait(timeout=10) == 0
        finally:
            proc.kill()
            pool.shutdown()


def test_serve_fails_fast_on_a_taken_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            serve(pa.ScriptedClient(lambda: "x"), port=taken.getsockname()[1])


async def test_serving_a_local_model(tiny_model_dir: Path) -> None:
    """LocalClient behind the server gives over HTTP exactly what it gives in-process."""
    local = pytest.importorskip("palaestra.clients.local")
    client = local.LocalClient(tiny_model_dir, name="tiny")
    tokenizer = client.tokenizer
    sampling = pa.Sampling(max_tokens=8, seed=3, logprobs=True)
    try:
        direct = await client.chat(USER, sampling=sampling)
        async with running(client) as url:
            async with pa.OpenAIClient("tiny", base_url=url) as http:
                over_http = await http.chat(USER, sampling=sampling.replace(extra={"return_token_ids": True}))
            async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as sdk:
                reply = await sdk.chat.completions.create(
                    model="tiny", messages=USER, max_tokens=8, seed=3, logprobs=True
                )
                stream = await sdk.chat.completions.create(
                    model="tiny", messages=USER, max_tokens=8, seed=3, stream=True
                )
                streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
                    await sdk.chat.completions.create(model="tiny", messages=USER, frequency_penalty=0.5)
    finally:
        await client.aclose()
    assert direct.token_ids and len(direct.token_ids) == len(direct.logprobs or ())
    assert (over_http.content, over_http.token_ids, over_http.logprobs) == (
        direct.content,
        direct.token_ids,
        direct.logprobs,
    )
    assert reply.choices[0].message.content == streamed == direct.content
    tokens = [t.token for t in reply.choices[0].logprobs.content]
    assert tokens == [tokenizer.decode([i]) for i in direct.token_ids]  # the client's tokenizer, as text


class Streamer:
    """A streaming client: one word per chunk, 20 ms apart; records when its generation ends."""

    model = MODEL

    def __init__(self) -> None:
        self.ended: list[str] = []

    async def chat(
        self, messages: pa.Messages, *, tools: Any = None, sampling: pa.Sampling
    ) -> pa.ModelResponse:
        raise AssertionError("a streamed request must use chat_stream")

    async def chat_stream(
        self, messages: pa.Messages, *, tools: Any = None, sampling: pa.Sampling
    ) -> AsyncIterator[pa.ChatChunk]:
        words = messages[-1]["content"].split()
        finished = False
        try:
            for i, word in enumerate(words):
                await asyncio.sleep(0.02)
                yield pa.ChatChunk(text=word if i == 0 else " " + word, token_ids=[i], logprobs=[-0.5])
            reply = pa.ModelResponse(
                {"role": "assistant", "content": " ".join(words)},
                "stop",
                pa.Usage(3, len(words)),
                token_ids=list(range(len(words))),
                logprobs=[-0.5] * len(words),
            )
            finished = True
            self.ended.append("done")
            yield pa.ChatChunk(response=reply)
        except (GeneratorExit, asyncio.CancelledError):
            if not finished:
                self.ended.append("cancelled")
            raise


async def test_a_streaming_client_streams_live_and_a_disconnect_cancels_it() -> None:
    streamer = Streamer()
    text = " ".join(f"w{i}" for i in range(40))
    async with running(streamer) as url, openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "a b c"}], stream=True, logprobs=True
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "a b c"
        assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
        assert [t.logprob for t in chunks[-1].choices[0].logprobs.content] == [-0.5] * 3
        assert streamer.ended == ["done"]

        # a caller that leaves after the first words: the server stops generating for it
        async with aiohttp.ClientSession() as session:
            body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": True}
            async with session.post(f"{url}/chat/completions", json=body) as resp:
                first = await resp.content.readline()
                assert first.startswith(b"data: ")
        for _ in range(100):
            if len(streamer.ended) == 2:
                break
            await asyncio.sleep(0.01)
        assert streamer.ended == ["done", "cancelled"]  # well before its 40 words (0.8 s) were made


@pytest.mark.asyncio
async def test_the_access_log_has_a_line_per_request_and_no_header(recorder: Recorder) -> None:
    import logging

    from palaestra.serve import access_logger

    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Lines()
    access_logger().addHandler(handler)
    try:
        async with (
            running(pa.ScriptedClient(recorder, model=MODEL), api_key="s3cret", access_log=True) as url,
            aiohttp.ClientSession(headers={"Authorization": "Bearer s3cret"}) as session,
        ):
            async with session.get(f"{url}/models") as resp:
                assert resp.status == 200
            async with session.get(f"{url}/nowhere") as resp:
                assert resp.status == 404
        async with (
            running(pa.ScriptedClient(recorder, model=MODEL)) as url,
            aiohttp.ClientSession() as session,
        ):
            async with session.get(f"{url}/models") as resp:  # no access_log: no line
                assert resp.status == 200
    finally:
        access_logger().removeHandler(handler)
    assert len(lines) == 2, lines
    assert '"GET /v1/models HTTP/1.1" 200' in lines[0] and '"GET /v1/nowhere HTTP/1.1" 404' in lines[1]
    assert all(line.startswith("127.0.0.1 ") and "s3cret" not in line for line in lines)
