"""The GPU path's decisions, made and checked on this CPU: which device and precision both trainers
pick, when AdamW fuses, the dtype LocalClient samples in on CUDA; and that the code paths a GPU run
takes (bf16 autocast, gradient checkpointing) compute the same update as the float32 one."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from palaestra.clients.local import pick_dtype  # noqa: E402 - after the torch skip
from palaestra.train.common import fused_adamw, optimizer_and_schedule, pick_device, use_bf16  # noqa: E402
from palaestra.train.config import ConfigError, load_config  # noqa: E402
from palaestra.train.losses import LossConfig  # noqa: E402
from palaestra.train.model import add_lora, backbone_and_head, enable_gradient_checkpointing  # noqa: E402
from palaestra.train.policy_update import policy_update  # noqa: E402
from palaestra.train.rollout_tokens import TokenSequence  # noqa: E402
from palaestra.train.sft_config import LoraConfig, OptimConfig, SFTConfig  # noqa: E402

CUDA = torch.device("cuda")
CPU = torch.device("cpu")


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    """torch as it looks on a machine with a CUDA GPU; ``gpu.bf16`` says whether it has bf16."""
    state = SimpleNamespace(bf16=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: state.bf16)
    return state


def test_auto_picks_cuda_when_torch_sees_a_gpu(gpu: Any) -> None:
    assert pick_device("auto") == CUDA


@pytest.mark.parametrize(
    "setting, device, bf16, expected",
    [
        ("auto", CUDA, True, True),
        ("auto", CUDA, False, False),
        ("auto", CPU, True, False),
        ("bf16", CPU, True, True),
        ("no", CUDA, True, False),
    ],
)
def test_bf16_autocast_on_a_gpu_that_has_it_or_when_asked(
    gpu: Any, setting: str, device: Any, bf16: bool, expected: bool
) -> None:
    gpu.bf16 = bf16
    assert use_bf16(setting, device) is expected


def test_local_client_samples_cuda_in_bf16_and_the_cpu_in_float32(gpu: Any) -> None:
    assert pick_dtype("auto", CUDA) == torch.bfloat16
    gpu.bf16 = False
    assert pick_dtype("auto", CUDA) == torch.float16  # a GPU without bf16 (a V100)
    assert pick_dtype("auto", CPU) == torch.float32


def test_adamw_fuses_when_every_parameter_is_on_cuda() -> None:
    on = [SimpleNamespace(device=CUDA)] * 2
    assert fused_adamw(on) and not fused_adamw([*on, SimpleNamespace(device=CPU)]) and not fused_adamw([])
    optimizer, _, _ = optimizer_and_schedule(torch.nn.Linear(2, 2), OptimConfig(), 10, None)
    assert not optimizer.defaults.get("fused")  # the CPU has no fused kernel worth it


def test_gradient_checkpointing_needs_prefix_sharing_off_in_sft(tmp_path: Path) -> None:
    overrides = {"data.path": str(tmp_path), "model.path": "m", "train.gradient_checkpointing": "true"}
    with pytest.raises(ConfigError, match="gradient_checkpointing needs share_prefix = false"):
        load_config(SFTConfig, None, overrides)
    load_config(SFTConfig, None, {**overrides, "train.share_prefix": "false"})


def sequences() -> list[TokenSequence]:
    """Two sampled replies to train on, with made-up sampler logprobs and advantages."""
    return [
        TokenSequence(
            [1, 5, 9, 13, 17, 2],
            [False, False, True, True, True, True],
            [0, 0, -3.0, -4.0, -2.5, -3.5],
            0.7,
            0,
        ),
        TokenSequence([1, 6, 10, 14], [False, True, True, True], [0, -3.2, -2.0, -4.1], -0.4, 1),
    ]


def update(model: Any, *, bf16: bool = False) -> tuple[Any, Any]:
    """One CISPO update of ``model`` in place on ``sequences()``: its stats, and the weights after."""
    optimizer, scheduler, _ = optimizer_and_schedule(model, OptimConfig(lr=1e-2), 1, None)
    backbone, head = backbone_and_head(model)
    model.train()
    stats = policy_update(
        model,
        head,
        backbone,
        optimizer,
        scheduler,
        sequences(),
        LossConfig("cispo"),
        passes=1,
        micro_batch_tokens=64,
        max_grad_norm=1.0,
        device=CPU,
        bf16=bf16,
        pad_id=0,
    )
    return stats, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_gradient_checkpointing_computes_the_same_update(tiny_model_dir: Path, lora: bool) -> None:
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    if lora:
        base = add_lora(base, LoraConfig(enabled=True, rank=4, target_modules=("q_proj", "v_proj")))
    checkpointed = copy.deepcopy(base)
    enable_gradient_checkpointing(checkpointed)
    plain_stats, plain = update(base)
    stats, weights = update(checkpointed)
    assert stats.loss == pytest.approx(plain_stats.loss, rel=1e-5) and stats.grad_norm > 0
    assert stats.grad_norm == pytest.approx(plain_stats.grad_norm, rel=1e-4)
    assert all(torch.allclose(weights[k], plain[k], atol=1e-6) for k in plain)


def test_a_bf16_autocast_update_is_the_float32_one_to_bf16_precision(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    plain_stats, _ = update(copy.deepcopy(model))
    stats, weights = update(model, bf16=True)
    assert all(v.dtype == torch.float32 for v in weights.values())  # the weights stay float32 (autocast)
    assert stats.loss == pytest.approx(plain_stats.loss, rel=0.05, abs=0.02)
    # the trainer's logprobs, measured against the same sampler logprobs, move by bf16's rounding only
    assert stats.mismatch["log_ratio_mean"] == pytest.approx(plain_stats.mismatch["log_ratio_mean"], abs=0.05)
