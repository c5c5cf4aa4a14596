"""Training: supervised fine-tuning now (``palaestra train sft``), reinforcement learning later.

Needs the ``train`` extra (torch, transformers, peft). Importing this package is light: the
trainer and its dependencies load on first use of ``train_sft``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from palaestra.train.config import ConfigError, load_config
from palaestra.train.sft_config import SFTConfig

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["ConfigError", "SFTConfig", "load_config", "train_sft"]


def train_sft(config: SFTConfig, *, resume: str | Path | None = None, progress: bool | None = None) -> Path:
    """Run supervised fine-tuning; returns the run folder (see ``palaestra.train.sft.train_sft``)."""
    from palaestra.train import sft

    return sft.train_sft(config, resume=resume, progress=progress)


def __getattr__(name: str) -> Any:
    raise AttributeError(f"module 'palaestra.train' has no attribute {name!r}")
