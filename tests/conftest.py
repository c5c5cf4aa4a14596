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
