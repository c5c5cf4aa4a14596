"""Tests for LocalClient.chat_stream: chunks as tokens come, the same reply as chat, cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import palaestra as pa  # noqa: E402 - after the skips: these tests need torch and transformers
from palaestra.clients.base import StreamingClient  # noqa: E402
from palaestra.clients.local import LocalClient  # noqa: E402
from palaestra.clients.local_sampling import releasable  # noqa: E402


@pytest.fixture
def client(tiny_model_dir: Path) -> LocalClient:
    return LocalClient(tiny_model_dir, device="cpu", dtype="float32", name="tiny", prefix_cache_bytes=0)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def until(condition: Callable[[], bool]) -> None:
    """Wait for the worker thread to make ``condition`` true (a broken client fails, not hangs)."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), timeout=60)


async def collect(client: LocalClient, messages: list, sampling: pa.Sampling) -> list[pa.ChatChunk]:
    return [chunk async for chunk in client.chat_stream(messages, sampling=sampling)]


async def test_a_streamed_reply_is_the_chat_reply_in_pieces(client: LocalClient) -> None:
    assert isinstance(client, StreamingClient)
    for seed in range(4):
        sampling = pa.Sampling(temperature=1.0, max_tokens=40, seed=seed)
        chunks = await collect(client, user("the cat sat."), sampling)
        reply = await client.chat(user("the cat sat."), sampling=sampling)
        final = chunks[-1].response
        assert final is not None and all(c.response is None for c in chunks[:-1])
        assert "".join(c.text for c in chunks) == final.content == reply.content
        assert [t for c in chunks for t in c.token_ids] == final.token_ids == reply.token_ids
        assert [lp for c in chunks for lp in c.logprobs] == final.logprobs == reply.logprobs
        assert len(chunks) == len(reply.token_ids)  # one chunk per generated token
        assert (final.finish_reason, final.usage) == (reply.finish_reason, reply.usage)


async def test_a_stop_string_is_never_streamed(client: LocalClient) -> None:
    sampling = pa.Sampling(temperature=0.0, max_tokens=30)
    full = await client.chat(user("a dog."), sampling=sampling)
    stop = next(
        full.content[i : i + 3] for i in range(3, len(full.content)) if full.content[i : i + 3].strip()
    )
    chunks = await collect(client, user("a dog."), sampling.replace(stop=[stop]))
    texts = [c.text for c in chunks]
    assert "".join(texts) == full.content[: full.content.index(stop)] == chunks[-1].response.content
    assert chunks[-1].response.finish_reason == "stop"
    assert "" in texts[:-1]  # the start of the stop string was held back before it completed


def test_releasable_holds_back_partial_characters_and_stop_string_starts() -> None:
    assert releasable("hello wor", []) == 9
    assert releasable("caf\ufffd", []) == 3  # the rest of a multi-byte character is still to come
    assert releasable("hello wor", ["world"]) == 6
    assert releasable("hello wo", ["xy", "wor"]) == 6
    assert releasable("hello w", ["a", "ww"]) == 6
    assert releasable("hello", ["hello!"]) == 0


async def test_closing_a_stream_early_frees_its_row_at_the_next_step(client: LocalClient) -> None:
    long = pa.Sampling(temperature=1.0, max_tokens=200, seed=1)
    other = asyncio.create_task(client.chat(user("the dog ran."), sampling=long.replace(max_tokens=80)))
    stream = client.chat_stream(user("the cat sat."), sampling=long)
    received = [await anext(stream) for _ in range(3)]
    assert all(c.response is None for c in received)
    await stream.aclose()
    await until(lambda: client.stats.cancelled == 1)  # the worker notices at its next step
    assert client.stats.active == 1 and not other.done()  # the other request keeps running alone
    await other
    assert client.stats.tokens < 80 + 20  # the closed stream stopped generating


async def test_cancelling_the_consuming_task_cancels_the_generation(client: LocalClient) -> None:
    received: list[pa.ChatChunk] = []

    async def consume() -> None:
        async for chunk in client.chat_stream(user("the cat sat."), sampling=pa.Sampling(max_tokens=200)):
            received.append(chunk)

    task = asyncio.create_task(consume())
    await until(lambda: len(received) >= 3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: client.stats.cancelled == 1)
    assert client.stats.active == 0 and client.stats.tokens < 50
    # seeded: unseeded, the random model samples its end token first now and then (a reply of 1 token)
    after = await client.chat(user("the cat sat."), sampling=pa.Sampling(max_tokens=4, seed=1))
    assert len(after.token_ids) == 4


async def test_a_failing_stream_raises_and_bad_requests_fail_at_once(client: LocalClient) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        await collect(client, user("a"), pa.Sampling(max_tokens=0))
    with pytest.raises(ValueError, match="at most 256"):
        await collect(client, user("the cat sat. " * 100), pa.Sampling(max_tokens=4))
    await client.aclose()
    with pytest.raises(pa.ModelError, match="closed"):
        await collect(client, user("a"), pa.Sampling(max_tokens=4))
