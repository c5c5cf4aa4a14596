"""OpenAIClient over real HTTP against the fake server: requests, responses, retries and faults."""

from __future__ import annotations

import asyncio
import difflib
from collections import Counter

import pytest

import palaestra as pa
from palaestra.testing import FakeOpenAIServer, FaultPlan

TRANSPORTS = ["aiohttp", "openai"]


def client_for(server: FakeOpenAIServer, transport: str = "aiohttp", **kwargs: object) -> pa.OpenAIClient:
    options: dict = {"timeout": 2.0, "max_retries": 2, "backoff": 0.01, "max_backoff": 0.05}
    options.update(kwargs)
    return pa.OpenAIClient(server.model, base_url=server.base_url, transport=transport, **options)


def reverse_env(n: int = 6) -> pa.SingleTurnEnv:
    def similarity(completion, answer, parser) -> float:
        return difflib.SequenceMatcher(None, parser.parse_answer(completion) or "", answer).ratio()

    rows = [
        {"question": f"text number {i} to reverse", "answer": f"text number {i} to reverse"[::-1]}
        for i in range(n)
    ]
    return pa.SingleTurnEnv(
        dataset=rows,
        system_prompt="Reverse the text inside <reversed_text> tags.",
        parser=pa.XMLParser(["reversed_text"]),
        rubric=pa.Rubric([similarity]),
    )


def reverse_reply(body: dict) -> str:
    return f"<reversed_text>{body['messages'][-1]['content'][::-1]}</reversed_text>"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_request_carries_sampling_and_response_is_parsed(transport: str) -> None:
    async with FakeOpenAIServer(lambda body: "one two three") as server:
        async with client_for(server, transport) as client:
            sampling = pa.Sampling(
                temperature=0.7, top_p=0.9, max_tokens=50, stop=["</x>"], seed=11, logprobs=True
            )
            sampling.extra["top_k"] = 20
            response = await client.chat([{"role": "user", "content": "hi there"}], sampling=sampling)
    assert response.message == {"role": "assistant", "content": "one two three"}
    assert response.finish_reason == "stop"
    assert response.usage.completion_tokens == 3
    assert response.usage.prompt_tokens == 2
    assert response.token_ids is not None and len(response.token_ids) == 3
    assert response.logprobs is not None and all(lp < 0 for lp in response.logprobs)
    body = server.requests[0]
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and body["max_tokens"] == 50
    assert body["stop"] == ["</x>"] and body["seed"] == 11 and body["logprobs"] is True
    assert body["top_k"] == 20


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_extra_body_asks_for_token_ids_and_the_prompt_ids_come_back(transport: str) -> None:
    """vLLM's ``return_token_ids``: the completion's ids and the prompt's, as an RL trainer needs them."""
    async with FakeOpenAIServer(lambda body: "one two three") as server:
        async with client_for(server, transport, extra_body={"return_token_ids": True}) as client:
            sampling = pa.Sampling(max_tokens=5, logprobs=True)
            response = await client.chat([{"role": "user", "content": "hi there"}], sampling=sampling)
    assert server.requests[0]["return_token_ids"] is True
    assert response.token_ids is not None and len(response.token_ids) == 3
    assert response.prompt_token_ids is not None and len(response.prompt_token_ids) == 2


def test_token_ids_that_are_not_lists_of_integers_are_none() -> None:
    from palaestra.clients.openai import parse_completion

    body = {"choices": [{"message": {"content": "x"}, "token_ids": ["a"]}], "prompt_token_ids": [1, True]}
    response = parse_completion(body)
    assert response.token_ids is None and response.prompt_token_ids is None


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_tool_calls_and_length_finish(transport: str) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    replies = iter([{"role": "assistant", "content": None, "tool_calls": [call]}, "a b c d e f"])
    async with FakeOpenAIServer(lambda body: next(replies)) as server:
        async with client_for(server, transport) as client:
            tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
            first = await client.chat([{"role": "user", "content": "x"}], tools=tools, sampling=pa.Sampling())
            second = await client.chat([{"role": "user", "content": "x"}], sampling=pa.Sampling(max_tokens=2))
    assert first.message["tool_calls"][0]["function"]["name"] == "f"
    assert first.finish_reason == "tool_calls"
    assert server.requests[0]["tools"] == tools
    assert second.finish_reason == "length" and second.content == "a b"


async def test_seed_is_not_sent_when_disabled() -> None:
    async with FakeOpenAIServer() as server:
        async with client_for(server, send_seed=False) as client:
            await client.chat([{"role": "user", "content": "x"}], sampling=pa.Sampling(seed=3))
    assert "seed" not in server.requests[0]


def test_remote_endpoint_without_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PALAESTRA_TEST_KEY", raising=False)
    with pytest.raises(pa.ClientConfigError, match="PALAESTRA_TEST_KEY"):
        pa.OpenAIClient("m", base_url="https://example.invalid/v1", api_key_var="PALAESTRA_TEST_KEY")
    pa.OpenAIClient("m", base_url="https://example.invalid/v1", api_key="")  # explicitly keyless


async def test_api_key_from_environment_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PALAESTRA_TEST_KEY", "sekrit")
    async with FakeOpenAIServer(api_key="sekrit") as server:
        ok = pa.OpenAIClient(server.model, base_url=server.base_url, api_key_var="PALAESTRA_TEST_KEY")
        wrong = pa.OpenAIClient(server.model, base_url=server.base_url, api_key="nope", max_retries=0)
        async with ok, wrong:
            response = await ok.chat([{"role": "user", "content": "hello"}], sampling=pa.Sampling())
            with pytest.raises(pa.ModelHTTPError) as info:
                await wrong.chat([{"role": "user", "content": "hello"}], sampling=pa.Sampling())
    assert response.content == "hello"
    assert info.value.status == 401
    assert not isinstance(info.value, pa.TransientModelError)  # a 401 is not retried


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_transient_failures_are_retried_until_success(transport: str) -> None:
    plan = FaultPlan([{"fault": "status", "status": 500, "attempts": 2}])
    async with FakeOpenAIServer(reverse_reply, faults=plan) as server:
        async with client_for(server, transport, max_retries=2) as client:
            rollouts = await reverse_env(4).run(client, pa.RunSpec(rollouts_per_example=2, max_concurrent=8))
    assert [r.error for r in rollouts] == [None] * 8
    assert all(r.reward == 1.0 for r in rollouts)
    # both rollouts of an example send the same messages: 2 failed attempts, then 2 answers
    assert server.request_count == 4 * (2 + 2)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("fault", "error_type"),
    [
        ({"fault": "status", "status": 500}, "TransientHTTPError"),
        ({"fault": "status", "status": 429}, "TransientHTTPError"),
        ({"fault": "status", "status": 503}, "TransientHTTPError"),
        ({"fault": "status", "status": 400}, "ModelHTTPError"),
        ({"fault": "hang", "seconds": 5}, "ModelTimeout"),
        ({"fault": "close"}, "ModelConnectionError"),
        ({"fault": "malformed"}, "BadResponseError"),
        ({"fault": "bad_shape"}, "BadResponseError"),
    ],
)
async def test_every_fault_ends_as_a_recorded_error_and_nothing_is_lost(
    transport: str, fault: dict, error_type: str
) -> None:
    # every third request fails for good; all other rollouts must still come back scored
    plan = FaultPlan([None, None, fault])
    async with FakeOpenAIServer(reverse_reply, faults=plan) as server:
        async with client_for(server, transport, timeout=0.3, max_retries=0) as client:
            rollouts = await reverse_env(6).run(client, pa.RunSpec(rollouts_per_example=2, max_concurrent=4))
    keys = Counter((r.example_id, r.rollout_index) for r in rollouts)
    assert sorted(keys) == [(e, i) for e in range(6) for i in range(2)] and set(keys.values()) == {1}
    failed = [r for r in rollouts if r.error is not None]
    assert len(failed) == 4  # requests 2, 5, 8, 11 of 12
    for r in failed:
        assert (r.error.type, r.error.stage, r.stop_reason) == (error_type, "model", "error")
        assert r.reward is None or r.reward < 1.0  # the reward saw no reply
    assert all(r.reward == 1.0 and r.stop_reason == "answered" for r in rollouts if r.error is None)


async def test_retry_after_header_sets_the_delay() -> None:
    plan = FaultPlan([{"fault": "status", "status": 429, "retry_after": 0.3, "attempts": 1}])
    async with FakeOpenAIServer(faults=plan) as server:
        async with client_for(server, max_retries=1, max_backoff=5.0) as client:
            loop = asyncio.get_running_loop()
            start = loop.time()
            response = await client.chat([{"role": "user", "content": "ping"}], sampling=pa.Sampling())
            elapsed = loop.time() - start
    assert response.content == "ping"
    assert elapsed >= 0.3


async def test_retries_are_bounded() -> None:
    plan = FaultPlan([{"fault": "status", "status": 502}])
    async with FakeOpenAIServer(faults=plan) as server:
        async with client_for(server, max_retries=3) as client:
            with pytest.raises(pa.TransientModelError, match="502"):
                await client.chat([{"role": "user", "content": "x"}], sampling=pa.Sampling())
    assert server.request_count == 4


async def test_unreachable_server_is_a_connection_error() -> None:
    async with FakeOpenAIServer() as server:
        url = server.base_url
    client = pa.OpenAIClient("fake-model", base_url=url, max_retries=1, backoff=0.01)
    with pytest.raises(pa.ModelConnectionError):
        await client.chat([{"role": "user", "content": "x"}], sampling=pa.Sampling())
    await client.aclose()


async def test_scripted_and_http_clients_give_identical_rollouts() -> None:
    env = reverse_env(5)
    async with FakeOpenAIServer(reverse_reply) as server:
        async with client_for(server) as http:
            over_http = await env.run(http, pa.RunSpec(rollouts_per_example=3, seed=7))
    scripted = pa.ScriptedClient(lambda messages: reverse_reply({"messages": messages}), model="fake-model")
    in_process = await env.run(scripted, pa.RunSpec(rollouts_per_example=3, seed=7))
    assert [r.reward for r in over_http] == [r.reward for r in in_process] == [1.0] * 15
    assert [r.completion for r in over_http] == [r.completion for r in in_process]
    assert [r.seed for r in over_http] == [r.seed for r in in_process]
    # the engine's per-request seeds reached the server, one per rollout, all different
    assert len({body["seed"] for body in server.requests}) == 15


async def test_client_survives_a_new_event_loop() -> None:
    # a user calling asyncio.run twice with one client must not hit a closed-loop session
    async with FakeOpenAIServer() as server:
        client = client_for(server)
        first = await client.chat([{"role": "user", "content": "one"}], sampling=pa.Sampling())

        def second_loop() -> str:
            async def go() -> str:
                response = await client.chat([{"role": "user", "content": "two"}], sampling=pa.Sampling())
                await client.aclose()
                return response.content

            return asyncio.run(go())

        second = await asyncio.to_thread(second_loop)
    assert (first.content, second) == ("one", "two")
