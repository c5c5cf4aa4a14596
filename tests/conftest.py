"""Fixtures shared by the test modules: a tiny local model built here (nothing is downloaded)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # models in tests are built locally; nothing may be downloaded

WORDS = (
    "the a cat dog bird sat ran flew on under over mat tree house red blue big small one two three".split()
)


def tiny_sentences(n: int = 400, seed: int = 0) -> list[str]:
    """Short sentences of ``WORDS``: the text the tiny test model's tokenizer is trained on."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + "." for _ in range(n)]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~60k-parameter random Llama and its trained tokenizer (ChatML, takes tools), saved once."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from palaestra.tiny_model import build_tiny_model

    path = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_model(tiny_sentences(), path=path)
    return path


@pytest.fixture(scope="session")
def sliding_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_model_dir``'s model with sliding-window attention over the last 8 tokens (a Mistral):
    far shorter than any chat prompt, so every cache and mask path meets the window."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from palaestra.tiny_model import TinyConfig, build_tiny_model

    path = tmp_path_factory.mktemp("tiny-sliding")
    build_tiny_model(tiny_sentences(), TinyConfig(attention_window=8), path=path)
    return path


@pytest.fixture(scope="session")
def tiny_tictactoe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama whose tokenizer was trained on tic-tac-toe games, with room for a whole game."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import asyncio

    import tictactoe

    import palaestra as pa
    from palaestra.tiny_model import TinyConfig, build_tiny_model

    env = pa.load_environment("tictactoe", num_examples=40, seed=123)
    games = asyncio.run(env.run(pa.ScriptedClient(tictactoe.heuristic_player), pa.RunSpec()))
    texts = [str(m.get("content") or "") for r in games for m in r.messages]
    path = tmp_path_factory.mktemp("tiny-tictactoe")
    build_tiny_model(texts, TinyConfig(vocab_size=600, max_positions=2048), path=path)
    return path
