"""Checkpoints: a loadable model folder plus the trainer's state, written atomically.

``RUN_DIR/checkpoints/step-000040/`` holds the model (see ``model.save_model``: a plain
transformers folder) and ``trainer_state.pt``: the step, the optimizer and scheduler states, the
RNG states and a fingerprint of the tokenised data. The data order is a pure function of the
seed and the step, so these are all a resumed run needs to take the very step the uninterrupted
run would have taken. A sharded run (FSDP) saves the same: its whole model and optimizer state.
A checkpoint is written under a temporary name and renamed when complete, so a killed save never
leaves half a checkpoint; ``RUN_DIR/final`` links to the last one. A save that fails (a full disk)
removes its temporary folder and stops the run with one line that says which folder, how much it
needed and how much is free; the checkpoints before it stay as they were.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

from palaestra.train.model import save_model

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"
FINAL_LINK = "final"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step-{step:06d}"


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    scheduler: Any,
    extra: dict[str, Any],
    full: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` (replacing one of the same step) and return its folder.

    ``full``: the whole model's state dict and optimizer state, gathered from a sharded model
    (``fsdp.Shards.full_state``); they are saved in place of the live model's and optimizer's.

    A failed write raises ``TrainingError`` (one line: the folder, the space it needs and the space
    left, the last good checkpoint) after removing the temporary folder."""
    import torch

    target = checkpoint_dir(run_dir, step)
    tmp = target.with_name(target.name + ".tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_model(model, tokenizer, tmp, weights=full[0] if full else None)
        state = {
            "step": step,
            "optimizer": full[1] if full else optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": {
                "python": random.getstate(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
            **extra,
        }
        torch.save(state, tmp / STATE_FILE)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # no half checkpoint, and its space back
        # here, not at the top: common.py imports this module
        from palaestra.train.common import write_failed

        needed = checkpoint_bytes(model, optimizer)
        last = latest_checkpoint(run_dir)
        raise write_failed(exc, last, path=target, what="the checkpoint", needed=needed, step=step) from None
    return target


def checkpoint_bytes(model: Any, optimizer: Any) -> int:
    """About what a checkpoint takes on disk: the weights (float32) and the optimizer's states."""
    import torch

    size = sum(p.numel() * 4 for p in model.parameters())
    for per_param in optimizer.state_dict().get("state", {}).values():
        size += sum(v.numel() * v.element_size() for v in per_param.values() if isinstance(v, torch.Tensor))
    return size


def link_final(run_dir: Path, checkpoint: Path) -> Path:
    """Point ``RUN_DIR/final`` at ``checkpoint`` (a relative symlink, replaced atomically)."""
    link = run_dir / FINAL_LINK
    tmp = run_dir / (FINAL_LINK + ".tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(os.path.relpath(checkpoint, run_dir))
    tmp.replace(link)
    return link


def final_target(run_dir: Path) -> Path | None:
    """The checkpoint ``RUN_DIR/final`` points at now (relative to ``run_dir``), or None."""
    link = run_dir / FINAL_LINK
    return Path(os.readlink(link)) if link.is_symlink() else None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint of the highest step in ``run_dir``, if any."""
    folder = run_dir / CHECKPOINTS
    found = [p for p in folder.glob("step-*") if p.suffix != ".tmp" and (p / STATE_FILE).is_file()]
    return max(found, key=lambda p: int(p.name.removeprefix("step-")), default=None)


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state saved with ``checkpoint`` (on the CPU)."""
    import torch

    return torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=False)


def restore_rng(state: dict[str, Any]) -> None:
    """Put the RNGs back as they were when the checkpoint was saved (dropout draws, say)."""
    import torch

    random.setstate(state["rng"]["python"])
    torch.set_rng_state(state["rng"]["torch"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
