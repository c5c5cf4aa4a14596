"""The weights the remote sampler writes for its server: a tied output layer is written untied,
because vLLM's in-place reload refills the input embedding and not the output layer tied to it
(it then samples with the new body and the old output layer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_a_tied_model_is_served_untied_with_the_same_outputs(tmp_path: Path) -> None:
    from conftest import tiny_sentences
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from palaestra.tiny_model import TinyConfig, build_tiny_model
    from palaestra.train.samplers.sync import save_served

    model, tokenizer = build_tiny_model(tiny_sentences(), TinyConfig(seed=3, tie_embeddings=True))
    assert model.config.tie_word_embeddings
    with torch.no_grad():  # an update moves the tied matrix: the served output layer must follow
        model.get_input_embeddings().weight.add_(0.5)
    save_served(model, tokenizer, tmp_path / "served", base=False)

    saved = tmp_path / "served"
    assert json.loads((saved / "config.json").read_text())["tie_word_embeddings"] is False
    with safe_open(str(saved / "model.safetensors"), "pt") as weights:
        assert "lm_head.weight" in set(weights.keys())
        assert torch.equal(
            weights.get_tensor("lm_head.weight"), weights.get_tensor("model.embed_tokens.weight")
        )
    loaded = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    assert loaded.lm_head.weight.data_ptr() != loaded.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([tokenizer("the cat sat on the mat")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model.eval()(ids).logits)


def test_an_untied_model_is_served_as_it_is(tmp_path: Path) -> None:
    from conftest import tiny_sentences
    from safetensors import safe_open

    from palaestra.tiny_model import TinyConfig, build_tiny_model
    from palaestra.train.samplers.sync import save_served

    model, tokenizer = build_tiny_model(tiny_sentences(), TinyConfig(tie_embeddings=False))
    save_served(model, tokenizer, tmp_path / "served", base=False)
    model.save_pretrained(tmp_path / "plain")  # what transformers writes, for comparison
    served, plain = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("served", "plain"))
    assert served == plain and served["tie_word_embeddings"] is False
    assert sorted(p.name for p in (tmp_path / "served").glob("*.safetensors")) == ["model.safetensors"]
    with (
        safe_open(str(tmp_path / "served" / "model.safetensors"), "pt") as a,
        safe_open(str(tmp_path / "plain" / "model.safetensors"), "pt") as b,
    ):
        assert set(a.keys()) == set(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())
