"""OpenAIClient asks for token ids and logprobs where the server gives them: by default after
``check()`` finds ``palaestra serve`` (or vLLM), always with ``token_ids=True``, never with ``False``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

import palaestra as pa
from palaestra.serve import running, start

USER = [{"role": "user", "content": "hello"}]


def reply(messages: pa.Messages, sampling: pa.Sampling) -> pa.ModelResponse:
    """A reply with the token ids and logprobs a local model would give."""
    return pa.ModelResponse(
        message={"role": "assistant", "content": "hi there"},
        finish_reason="stop",
        token_ids=[7, 8],
        logprobs=[-0.5, -0.25] if sampling.logprobs else None,
        prompt_token_ids=[1, 2, 3],
    )


async def test_by_default_token_ids_come_once_check_finds_palaestra_serve() -> None:
    async with running(pa.ScriptedClient(reply, model="m")) as url:
        async with pa.OpenAIClient("m", base_url=url) as unchecked:
            plain = await unchecked.chat(USER, sampling=pa.Sampling())
        assert plain.token_ids is None and plain.logprobs is None  # not asked: not sent
        async with pa.OpenAIClient("m", base_url=url) as client:
            await client.check()  # what `palaestra eval -b URL` does before a run
            response = await client.chat(USER, sampling=pa.Sampling())
        assert response.token_ids == [7, 8] and response.logprobs == [-0.5, -0.25]
        assert response.prompt_token_ids == [1, 2, 3]
        async with pa.OpenAIClient("m", base_url=url, token_ids=False) as off:
            await off.check()
            assert "return_token_ids" not in off.request_body(USER, None, pa.Sampling())
        always = pa.OpenAIClient("m", base_url=url, token_ids=True)
        body = always.request_body(USER, None, pa.Sampling())
        assert body["return_token_ids"] is True and body["logprobs"] is True


async def test_a_server_that_is_not_known_to_give_them_is_not_asked() -> None:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "gpt-x", "owned_by": "openai"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner, url = await start(app, "127.0.0.1", 0)
    try:
        client = pa.OpenAIClient("gpt-x", base_url=url)
        await client.check()
        body: dict[str, Any] = client.request_body(USER, None, pa.Sampling())
        assert "return_token_ids" not in body and "logprobs" not in body  # OpenAI's API refuses the field
        await client.aclose()
    finally:
        await runner.cleanup()
