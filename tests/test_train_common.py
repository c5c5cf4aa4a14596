"""What both trainers share: the device check, the learning-rate schedule."""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")

from palaestra.train.common import lr_factor, pick_device  # noqa: E402 - after the torch skip
from palaestra.train.config import ConfigError  # noqa: E402
from palaestra.train.sft_config import OptimConfig  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_a_cuda_device_on_a_machine_without_one_is_a_config_error(name: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"train.device {name}: this torch .* sees no CUDA device; use cpu"
    ):
        pick_device(name)


@pytest.mark.parametrize("name", ["gpu", "cuda:x", ""])
def test_an_unknown_device_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match=r"train\.device"):
        pick_device(name)


def test_cpu_and_auto_are_devices() -> None:
    assert pick_device("cpu").type == "cpu"
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_cosine_schedule_warms_up_then_ends_at_its_floor() -> None:
    optim = OptimConfig(lr=1.0, schedule="cosine", warmup_steps=2, min_lr_ratio=0.1)
    factors = [lr_factor(k, optim, 12) for k in range(12)]
    assert factors[:2] == [0.5, 1.0]
    assert factors[2] == pytest.approx(1.0) and factors[-1] == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.9))
    )
    assert all(a >= b for a, b in itertools.pairwise(factors[1:]))  # falls after the warm-up
