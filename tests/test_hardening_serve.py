"""Hardening of `palaestra serve` over HTTP: API keys, body limits, content parts, cut-off
requests and model-name aliases."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import orjson
import pytest

import palaestra as pa
from palaestra.serve import create_app, running, serve, start

MODEL = "hard-model"


class Echo:
    """A policy answering ``echo: <last message content>`` and keeping every message list it saw."""

    def __init__(self) -> None:
        self.seen: list[pa.Messages] = []

    def __call__(self, messages: pa.Messages) -> str:
        self.seen.append(messages)
        return f"echo: {messages[-1]['content']}"


def chat_body(content: Any = "hello", model: str = MODEL, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


async def call(
    url: str, path: str, body: Any = None, *, key: str | None = None, data: bytes | None = None
) -> tuple[int, Any]:
    """GET (no body) or POST ``url + path``; returns (status, parsed JSON)."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with aiohttp.ClientSession() as session:
        if body is None and data is None:
            request = session.get(url + path, headers=headers)
        else:
            request = session.post(
                url + path, data=data if data is not None else orjson.dumps(body), headers=headers
            )
        async with request as resp:
            return resp.status, orjson.loads(await resp.read())


@contextlib.asynccontextmanager
async def app_running(client: pa.ModelClient, **options: Any) -> AsyncIterator[str]:
    runner, url = await start(create_app(client, **options), "127.0.0.1", 0, grace=0.1)
    try:
        yield url
    finally:
        await runner.cleanup()


# --- API keys ---------------------------------------------------------------------------------


async def test_an_api_key_is_required_on_every_route() -> None:
    async with running(pa.ScriptedClient(Echo(), model=MODEL), api_key="k") as url:
        for key in (None, "wrong", "", "kk"):
            status, body = await call(url, "/models", key=key)
            assert status == 401 and body["error"]["code"] == "invalid_api_key", (key, body)
            status, body = await call(url, "/chat/completions", chat_body(), key=key)
            assert status == 401 and body["error"]["type"] == "authentication_error", (key, body)
        assert (await call(url, "/models", key="k"))[0] == 200
        status, body = await call(url, "/chat/completions", chat_body(), key="k")
    assert status == 200 and body["choices"][0]["message"]["content"] == "echo: hello"


SERVE = """
import sys
import palaestra as pa
import palaestra.cli as cli
# a scripted model instead of a local one: what is under test is the command, not the model
cli.load_local = lambda model, **kw: pa.ScriptedClient(lambda: "pong", model=model)
raise SystemExit(cli.main(["serve", "scripted-model", "--port", "0", *sys.argv[1:]]))
"""


@contextlib.contextmanager
def serve_command(*args: str, key: str | None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``palaestra serve`` in a subprocess: yields its "serving" line and a dict that gets its exit
    status and stderr once the block ends (then it is stopped with SIGINT, as by Ctrl-C)."""
    env = {k: v for k, v in os.environ.items() if k != "PALAESTRA_API_KEY"}
    env["PYTHONUNBUFFERED"] = "1"
    if key is not None:
        env["PALAESTRA_API_KEY"] = key
    argv = [sys.executable, "-c", SERVE, *args]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        pool = ThreadPoolExecutor(1)  # a server that never starts fails the test instead of hanging it
        ended: dict[str, Any] = {}
        try:
            assert proc.stdout is not None
            yield pool.submit(proc.stdout.readline).result(timeout=60), ended
            proc.send_signal(signal.SIGINT)
            _, ended["stderr"] = proc.communicate(timeout=15)
            ended["code"] = proc.returncode
        finally:
            proc.kill()
            pool.shutdown(wait=False)


async def test_serve_command_requires_the_key_from_its_environment_variable() -> None:
    with serve_command(key="s3cret") as (line, ended):
        pattern = r"serving scripted-model at (http://127\.0\.0\.1:\d+/v1); requests need the API key\n"
        match = re.fullmatch(pattern, line)
        assert match is not None, line
        url, body = match[1], chat_body(model="scripted-model")
        assert (await call(url, "/models"))[0] == 401
        assert (await call(url, "/chat/completions", body))[0] == 401
        assert (await call(url, "/chat/completions", body, key="wrong"))[0] == 401
        status, reply = await call(url, "/chat/completions", body, key="s3cret")
        assert status == 200 and reply["choices"][0]["message"]["content"] == "pong"
    assert ended == {"stderr": "", "code": 0}


async def test_serve_command_warns_when_bound_to_all_interfaces_without_a_key() -> None:
    with serve_command("--host", "0.0.0.0", key=None) as (line, ended):
        match = re.fullmatch(r"serving scripted-model at http://0\.0\.0\.0:(\d+)/v1\n", line)
        assert match is not None, line
        assert (await call(f"http://127.0.0.1:{match[1]}/v1", "/models"))[0] == 200  # no key needed
    warning = "palaestra: warning: serving on 0.0.0.0 without an API key"
    assert ended["code"] == 0
    assert ended["stderr"].startswith(warning) and ended["stderr"].count("\n") == 1, ended
    assert "PALAESTRA_API_KEY" in ended["stderr"]


def test_ctrl_c_right_after_the_serving_line_is_a_clean_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []

    def say_then_ctrl_c(*args: Any, **kwargs: Any) -> None:
        said.append(" ".join(map(str, args)))
        os.kill(os.getpid(), signal.SIGINT)  # a supervisor that stops the server once it is up

    monkeypatch.setattr("palaestra.serve.print", say_then_ctrl_c, raising=False)
    interrupted = False
    try:
        serve(pa.ScriptedClient(lambda: "x", model=MODEL), port=0)
    except KeyboardInterrupt:
        interrupted = True
    assert said and said[0].startswith(f"serving {MODEL} at http://127.0.0.1:")
    assert not interrupted


# --- bodies -----------------------------------------------------------------------------------


async def test_a_body_over_the_limit_is_a_413_and_the_server_goes_on() -> None:
    policy = Echo()
    async with app_running(pa.ScriptedClient(policy, model=MODEL), max_body_bytes=4096) as url:
        status, body = await call(url, "/chat/completions", chat_body("x" * 8192))
        assert status == 413
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["type"] == "invalid_request_error" and "Too Large" in body["error"]["message"]
        assert policy.seen == []
        status, body = await call(url, "/chat/completions", chat_body("x" * 1000))
    assert status == 200 and body["choices"][0]["message"]["content"] == "echo: " + "x" * 1000


async def test_text_content_parts_are_joined_and_other_parts_are_refused() -> None:
    policy = Echo()
    async with running(pa.ScriptedClient(policy, model=MODEL)) as url:
        status, body = await call(url, "/chat/completions", chat_body([{"type": "text", "text": "Say hi"}]))
        assert status == 200 and body["choices"][0]["message"]["content"] == "echo: Say hi"
        assert policy.seen[-1][-1] == {"role": "user", "content": "Say hi"}
        split = [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]
        assert (await call(url, "/chat/completions", chat_body(split)))[1]["choices"][0]["message"][
            "content"
        ] == "echo: Say hi"

        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        for index, messages in [
            (0, [{"role": "user", "content": [1, {"type": "text", "text": "hi"}]}]),
            (1, [{"role": "system", "content": "be brief"}, {"role": "user", "content": [image]}]),
            (0, [{"role": "user", "content": [{"type": "text", "text": 5}]}]),
        ]:
            status, body = await call(url, "/chat/completions", {"model": MODEL, "messages": messages})
            assert status == 400, body
            assert body["error"]["param"] == f"messages[{index}]"
            assert body["error"]["message"].startswith(f"messages[{index}]: ")
    assert len(policy.seen) == 2  # the refused requests never reached the model


async def test_a_body_cut_short_by_the_caller_is_quiet_and_the_server_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    caplog.set_level(logging.DEBUG, logger="palaestra")
    policy = Echo()
    async with running(pa.ScriptedClient(policy, model=MODEL)) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        for _ in range(3):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            head = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            )
            writer.write(head.encode() + b'{"model": "' + b"x" * 89)  # 100 of the 1000 bytes
            await writer.drain()
            writer.close()
            await writer.wait_closed()
        await asyncio.sleep(0.2)  # let the server notice the closed connections
        status, body = await call(url, "/chat/completions", chat_body("still there?"))
    assert status == 200 and body["choices"][0]["message"]["content"] == "echo: still there?"
    assert policy.seen == [[{"role": "user", "content": "still there?"}]]
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert loud == [], [r.getMessage() for r in loud]
    assert "Traceback" not in caplog.text


# --- model names ------------------------------------------------------------------------------


async def test_every_served_model_name_is_listed_and_answered() -> None:
    names = ["main-name", "alias-one", "org/alias-two"]
    async with app_running(pa.ScriptedClient(Echo(), model="inner"), model_names=names) as url:
        status, listed = await call(url, "/models")
        assert status == 200 and [m["id"] for m in listed["data"]] == names
        for name in names:
            status, body = await call(url, "/chat/completions", chat_body("hi", model=name))
            assert status == 200 and body["model"] == name
        status, body = await call(url, "/chat/completions", chat_body("hi", model="inner"))
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert all(f"`{name}`" in body["error"]["message"] for name in names)
