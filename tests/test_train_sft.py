"""End-to-end SFT of tiny models on tic-tac-toe teacher games: it learns, resumes exactly, stops on NaN.

Every model here is a tiny Llama built from a config with a tokenizer trained on the games' text;
nothing is downloaded. Seeded and deterministic (the trainer runs single-threaded here).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.train import checkpoint as ckpt
from palaestra.train import sft
from palaestra.train.common import TrainingError
from palaestra.train.config import ConfigError
from palaestra.train.sft_config import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    OutputConfig,
    SFTConfig,
    TinyModelConfig,
    TrainConfig,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
tictactoe = pytest.importorskip("tictactoe")

TINY = TinyModelConfig(
    vocab_size=600,
    hidden_size=64,
    intermediate_size=192,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    max_positions=1024,
)


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    """Deterministic and fair on a shared machine: the trainer's maths on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_env(env: Any, client: pa.ModelClient, spec: pa.RunSpec) -> list[pa.Rollout]:
    """This file's one direct ``env.run``: the rollouts of ``spec``, with the client closed after."""

    async def go() -> list[pa.Rollout]:
        try:
            return await env.run(client, spec)
        finally:
            close = getattr(client, "aclose", None)
            if close is not None:
                await close()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def teacher_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first two replies of 96 heuristic-teacher games (short, so training is fast; the teacher's
    format is perfect, so there is nothing to filter)."""
    from palaestra.data.rollouts import save_dataset

    env = tictactoe.load_environment(num_examples=96, seed=1, max_turns=2)
    rollouts = run_env(env, pa.ScriptedClient(tictactoe.heuristic_player), pa.RunSpec(num_examples=96))
    return save_dataset(rollouts, tmp_path_factory.mktemp("teacher") / "games")


def tiny_config(data_path: Path, out: Path, **sections: Any) -> SFTConfig:
    """A small, fast config; ``sections`` replace fields, e.g. ``optim={"lr": 0.0}``."""
    config = SFTConfig(
        data=DataConfig(path=str(data_path), max_length=1024),
        model=ModelConfig(tiny=TINY),
        optim=OptimConfig(lr=1e-2, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1),
        train=TrainConfig(steps=80, batch_size=4, micro_batch_tokens=4096, seed=0),
        output=OutputConfig(dir=str(out)),
    )
    for name, changes in sections.items():
        config = dataclasses.replace(config, **{name: dataclasses.replace(getattr(config, name), **changes)})
    return config


def losses(run_dir: Path, key: str = "loss") -> list[float]:
    return [json.loads(line)[key] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def format_rate(model_dir: Path) -> float:
    """Mean format reward of greedy replies in held-out games (dataset seed 7; training used seed 1)."""
    env = tictactoe.load_environment(num_examples=8, seed=7, max_turns=2)
    client = pa.LocalClient(model_dir, device="cpu", dtype="float32")
    spec = pa.RunSpec(num_examples=8, sampling=pa.Sampling(temperature=0.0, max_tokens=40))
    rollouts = run_env(env, client, spec)
    return sum(r.metrics["format_reward"] for r in rollouts) / len(rollouts)


@pytest.mark.slow
@pytest.mark.parametrize("lr", [1e-2, 0.0])
def test_sft_teaches_the_reply_format_and_fails_at_lr_0(
    teacher_data: Path, tmp_path: Path, lr: float
) -> None:
    run_dir = sft.train_sft(tiny_config(teacher_data, tmp_path / "run", optim={"lr": lr}), progress=False)
    before = format_rate(run_dir / sft.BASE_MODEL_DIR)
    after = format_rate(run_dir / "final")
    curve = losses(run_dir)
    assert before < 0.1
    if lr > 0:
        assert sum(curve[-5:]) / 5 < 0.5 * sum(curve[:5]) / 5
        assert after > 0.9
    else:  # nothing moves: the same loss every epoch, no format learnt
        assert after < 0.1 and min(curve) > 0.9 * max(curve)


@pytest.mark.parametrize("lora", [False, True])
def test_resume_takes_the_same_next_step_as_an_uninterrupted_run(
    teacher_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lora: bool
) -> None:
    sections: dict[str, Any] = {"train": {"steps": 4}, "output": {"save_every": 2}}
    if lora:  # dropout draws random numbers: the RNG state must come back too
        sections["lora"] = {
            "enabled": True,
            "rank": 4,
            "dropout": 0.1,
            "target_modules": ("q_proj", "v_proj"),
        }
    whole = sft.train_sft(tiny_config(teacher_data, tmp_path / "whole", **sections), progress=False)

    real_save = ckpt.save_checkpoint

    def save_then_die(run_dir: Path, step: int, **kwargs: Any) -> Path:
        path = real_save(run_dir, step, **kwargs)
        if step == 2:
            raise KeyboardInterrupt  # killed right after the checkpoint of step 2
        return path

    config = tiny_config(teacher_data, tmp_path / "cut", **sections)
    monkeypatch.setattr(ckpt, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        sft.train_sft(config, progress=False)
    monkeypatch.setattr(ckpt, "save_checkpoint", real_save)
    resumed = sft.train_sft(sft.resume_config(tmp_path / "cut"), resume=tmp_path / "cut", progress=False)

    assert [json.loads(line)["step"] for line in (resumed / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        4,
    ]
    for key in ("loss", "grad_norm", "lr"):
        assert losses(resumed, key) == losses(whole, key)  # exactly, not approximately
    from safetensors.torch import load_file

    a, b = (
        load_file(whole / "final" / "model.safetensors"),
        load_file(resumed / "final" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(
    teacher_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_loss = sft.token_loss_sum
    calls = []

    def nan_at_step_3(*args: Any) -> Any:
        calls.append(1)
        loss = real_loss(*args)
        return loss * math.nan if len(calls) == 3 else loss  # one micro-batch a step here

    monkeypatch.setattr(sft, "token_loss_sum", nan_at_step_3)
    config = tiny_config(
        teacher_data,
        tmp_path / "run",
        train={"steps": 5, "micro_batch_tokens": 8192},
        output={"save_every": 2},
    )
    with pytest.raises(TrainingError) as caught:
        sft.train_sft(config, progress=False)
    message = str(caught.value)
    assert "step 3: the loss is nan" in message and "step-000002" in message
    run_dir = tmp_path / "run"
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-000002"]
    assert not (run_dir / "final").exists()
    assert losses(run_dir) and len(losses(run_dir)) == 2
    client = pa.LocalClient(run_dir / "checkpoints" / "step-000002", device="cpu")  # still loads
    assert client.hf_model is not None


def test_lora_checkpoints_are_plain_merged_models(teacher_data: Path, tmp_path: Path) -> None:
    lora = {"enabled": True, "rank": 4, "alpha": 8, "target_modules": ("q_proj", "v_proj", "down_proj")}
    run_dir = sft.train_sft(
        tiny_config(teacher_data, tmp_path / "run", train={"steps": 2}, lora=lora), progress=False
    )
    final = run_dir / "final"
    assert (final / "adapter" / "adapter_config.json").is_file()
    config = json.loads((final / "config.json").read_text())
    assert config["model_type"] == "llama"
    from safetensors.torch import load_file

    merged, base = (
        load_file(final / "model.safetensors"),
        load_file(run_dir / sft.BASE_MODEL_DIR / "model.safetensors"),
    )
    assert not any("lora" in key for key in merged)
    assert merged.keys() == base.keys()
    changed = {k for k in merged if not torch.equal(merged[k], base[k])}
    assert changed and all(any(t in k for t in ("q_proj", "v_proj", "down_proj")) for k in changed)
    env = tictactoe.load_environment(num_examples=2, seed=7, max_turns=1)
    spec = pa.RunSpec(num_examples=2, sampling=pa.Sampling(temperature=0.0, max_tokens=8))
    rollouts = run_env(env, pa.LocalClient(final, device="cpu"), spec)
    assert all(r.error is None for r in rollouts)


def test_shared_prefix_gives_the_same_loss_and_gradients(teacher_data: Path, tmp_path: Path) -> None:
    runs = {}
    for share in (True, False):
        config = tiny_config(teacher_data, tmp_path / str(share), train={"steps": 2, "share_prefix": share})
        runs[share] = sft.train_sft(config, progress=False)
    shared, plain = (losses(runs[s]) for s in (True, False))
    assert losses(runs[True], "shared_prefix")[0] > 100  # the system prompt and more
    assert losses(runs[False], "shared_prefix") == [0, 0]
    assert shared == pytest.approx(plain, rel=1e-5)
    assert losses(runs[True], "grad_norm") == pytest.approx(losses(runs[False], "grad_norm"), rel=1e-4)


def test_bad_input_is_refused_before_any_work(teacher_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cases = [
        (tiny_config(tmp_path / "missing", out), "no such dataset folder"),
        (tiny_config(teacher_data, out, data={"max_length": 100}), "shorter than the prompt of row 0"),
        (
            tiny_config(teacher_data, out, lora={"enabled": True, "target_modules": ("qkv_proj",)}),
            "qkv_proj not in the model; its linear modules are: down_proj, gate_proj, k_proj, lm_head",
        ),
    ]
    for config, message in cases:
        with pytest.raises(ValueError, match=message):
            sft.train_sft(config, progress=False)
        assert not out.exists()  # nothing written
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="has no rows"):
        sft.train_sft(tiny_config(empty, out), progress=False)
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        sft.train_sft(tiny_config(teacher_data, out), resume=tmp_path, progress=False)
