"""Live progress: tokens/s counts the tokens of replies still being generated, not only those of
finished rollouts, so a long first reply does not read "0 tok/s"."""

from __future__ import annotations

import asyncio
import io
import types

import pytest

import palaestra as pa
from palaestra.eval import progress
from palaestra.eval.progress import EvalProgress, token_counter


async def test_the_bar_shows_tokens_generated_before_any_rollout_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "REFRESH", 0.05)
    generated = [100]  # the client had made 100 tokens before this run: they are not this run's
    screen = io.StringIO()
    bar = EvalProgress(2, plain=False, file=screen, live_tokens=lambda: generated[0])
    with bar:
        for _ in range(5):  # a reply being generated: the client's count grows, no rollout ends
            generated[0] += 40
            await asyncio.sleep(0.06)
        assert bar.done == 0 and bar.generated() == 200
        assert bar.stats().endswith("tok/s") and " 0 tok/s" not in bar.stats()


async def test_plain_lines_show_the_live_count_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "HEARTBEAT", 0.05)
    generated = [0]
    screen = io.StringIO()
    with EvalProgress(2, plain=True, file=screen, live_tokens=lambda: generated[0]):
        generated[0] = 300
        await asyncio.sleep(0.2)
    line = screen.getvalue().splitlines()[0]
    assert line.startswith("eval 0/2") and " 0 tok/s" not in line


def test_local_and_openai_clients_count_their_tokens() -> None:
    local_like = types.SimpleNamespace(stats=types.SimpleNamespace(tokens=7))
    counter = token_counter(local_like)
    assert counter is not None and counter() == 7
    client = pa.OpenAIClient("m", base_url="http://127.0.0.1:9/v1")
    client.completion_tokens = 12
    counter = token_counter(client)
    assert counter is not None and counter() == 12
    assert token_counter(pa.ScriptedClient(lambda messages: "x")) is None  # counted per rollout
