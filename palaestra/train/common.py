"""What both trainers use: the device, the optimizer and its learning-rate schedule, the run's errors.

``palaestra/train/sft.py`` and ``palaestra/train/rl.py`` build their optimizer, pick their device
and report a diverged step through these, so the two behave alike and neither imports the other.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from palaestra.train import checkpoint as ckpt
from palaestra.train.config import ConfigError
from palaestra.train.sft_config import OptimConfig


class TrainingError(RuntimeError):
    """The run cannot go on (a NaN loss, say); what was saved before stays."""


def diverged(step: int, what: str, value: float, last_saved: Path | None) -> TrainingError:
    """The error of a step whose loss or gradient is not finite (the weights were not updated)."""
    kept = f"the last good checkpoint is {last_saved}" if last_saved else "no checkpoint was saved before it"
    return TrainingError(f"step {step}: the {what} is {value}; stopped before updating the weights; {kept}")


def pick_device(name: str) -> Any:
    """``auto``: CUDA when present, else CPU; anything else as ``torch.device`` reads it, if this torch
    and machine have it."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"train.device: {exc}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = (
                "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            )
            raise ConfigError(
                f"train.device {name}: this torch ({torch.__version__}, {build}) sees no CUDA device; "
                "use cpu or auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"train.device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif device.type not in ("cpu", "meta") and not _available(torch, device.type):
        raise ConfigError(f"train.device {name}: no {device.type} device on this machine; use cpu or auto")
    return device


def _available(torch: Any, kind: str) -> bool:
    backend = getattr(torch, kind, None) or getattr(torch.backends, kind, None)
    check = getattr(backend, "is_available", None)
    return bool(check()) if callable(check) else False


def optimizer_and_schedule(model: Any, optim: OptimConfig, updates: int, state: Any) -> tuple[Any, Any, int]:
    """AdamW over the trainable parameters, its learning-rate schedule over ``updates`` optimizer
    steps, and the step to start from: restored from a checkpoint's ``state`` (RNG included), if any."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: lr_factor(k, optim, updates))
    if state is None:
        return optimizer, scheduler, 0
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    ckpt.restore_rng(state)
    return optimizer, scheduler, int(state["step"])


def lr_factor(update: int, optim: OptimConfig, total: int) -> float:
    """The learning rate of optimizer step ``update`` (from 0) of ``total`` as a fraction of ``optim.lr``."""
    if update < optim.warmup_steps:
        return (update + 1) / optim.warmup_steps
    if optim.schedule == "constant":
        return 1.0
    progress = min(1.0, (update - optim.warmup_steps) / max(1, total - optim.warmup_steps))
    low = optim.min_lr_ratio
    return low + (1 - low) * 0.5 * (1 + math.cos(math.pi * progress))


def find_checkpoint(run_dir: Path, steps: int) -> tuple[Path, dict[str, Any]]:
    """The checkpoint a resumed run of ``steps`` steps continues from, and its trainer state."""
    checkpoint = ckpt.latest_checkpoint(run_dir)
    if checkpoint is None:
        raise ConfigError(f"--resume {run_dir}: no complete checkpoint to resume from")
    state = ckpt.load_state(checkpoint)
    if state["step"] >= steps:
        raise ConfigError(f"--resume: the run is at step {state['step']} already; raise train.steps to go on")
    return checkpoint, state
