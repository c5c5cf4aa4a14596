"""What both trainers use: the device and threads, the optimizer and its learning-rate schedule,
where a run starts from, the run folder's first writes, and the run's errors.

``palaestra/train/sft.py`` and ``palaestra/train/rl.py`` build their optimizer, pick their device
and report a diverged step or a full disk through these, so the two behave alike and neither
imports the other. A refusal (``ConfigError``) always comes before the run folder's first write,
and if the first writes themselves fail, a new run's folder is removed again: a re-run with a
fixed value never finds "output.dir is not empty".
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from palaestra.train import checkpoint as ckpt
from palaestra.train.config import ConfigError
from palaestra.train.model import ADAPTER_DIR
from palaestra.train.sft_config import ModelConfig, OptimConfig

CONFIG_FILE = "config.toml"  # the resolved config a run was started with; --resume reads it back
_OUT_OF_MEMORY = re.compile(r"alloc|out of memory|overflow", re.I)


class TrainingError(RuntimeError):
    """The run cannot go on (a NaN loss, a full disk); what was saved before stays."""


def kept(last_saved: Path | None) -> str:
    """What is left to resume from, for an error message."""
    return f"the last good checkpoint is {last_saved}" if last_saved else "no checkpoint was saved before it"


def diverged(step: int, what: str, value: float, last_saved: Path | None) -> TrainingError:
    """The error of a step whose loss or gradient is not finite (the weights were not updated)."""
    return TrainingError(
        f"step {step}: the {what} is {value}; stopped before updating the weights; {kept(last_saved)}"
    )


def write_failed(
    exc: OSError,
    last_saved: Path | None,
    *,
    path: Path | None = None,
    what: str = "",
    needed: int | None = None,
    step: int | None = None,
) -> TrainingError:
    """A write that failed (a full disk, say), as one line: which path (``path``, else the error's),
    why, how much space it needed and is left, and what is kept to resume from."""
    where = path or (Path(os.fsdecode(exc.filename)) if exc.filename else None)
    space = ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        free = free_bytes(where or Path.cwd())
        space = (
            f" ({f'it needs about {human_bytes(needed)}, ' if needed else ''}"
            f"{'free space unknown' if free is None else human_bytes(free) + ' free on that disk'})"
        )
    target = f"cannot write {what + ' ' if what else ''}{where}" if where else "a write failed"
    reason = exc.strerror or str(exc) or type(exc).__name__
    return TrainingError(f"{f'step {step}: ' if step else ''}{target}: {reason}{space}; {kept(last_saved)}")


@contextlib.contextmanager
def writes_stop_the_run(last_saved: Callable[[], Path | None]) -> Iterator[None]:
    """Around a run's steps: a write that fails (the log, the curves, a sample on a full disk) stops
    the run with one line naming the path; ``last_saved()`` says what is left to resume from."""
    try:
        yield
    except OSError as exc:
        raise write_failed(exc, last_saved()) from None


def point_final(run_dir: Path, checkpoint: Path) -> str:
    """Point ``RUN_DIR/final`` at ``checkpoint``; returns ``"RUN_DIR/final -> checkpoints/step-N"`` and,
    when it pointed elsewhere before (a resumed run), what it pointed to: a config that names
    ``final`` gets the new checkpoint from now on."""
    before = ckpt.final_target(run_dir)
    try:
        link = ckpt.link_final(run_dir, checkpoint)
    except OSError as exc:
        raise write_failed(exc, checkpoint, path=run_dir / ckpt.FINAL_LINK) from None
    now = ckpt.final_target(run_dir)
    text = f"{link} -> {now}"
    if before is not None and before != now:
        text += (
            f" (it pointed to {before} before: a config that names {link} gets the new checkpoint; "
            f"name {run_dir / before} to keep the old one)"
        )
    return text


def free_bytes(path: Path) -> int | None:
    """Free bytes on the disk that holds ``path`` (or its nearest existing parent); None if unknown."""
    for folder in (path, *path.absolute().parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def human_bytes(count: float) -> str:
    """``1234567`` → ``"1.2 MB"``."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


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


def use_bf16(mixed_precision: str, device: Any) -> bool:
    """bf16 autocast: when asked (``"bf16"``), or with ``"auto"`` on a CUDA device that has it (an
    H100 does, a V100 does not); float32 everywhere else, the CPU included."""
    import torch

    if mixed_precision == "bf16":
        return True
    return mixed_precision == "auto" and device.type == "cuda" and bool(torch.cuda.is_bf16_supported())


def fused_adamw(params: list[Any]) -> bool:
    """Whether AdamW should use its fused kernel: one kernel for every parameter instead of a few per
    parameter, on CUDA (all parameters there); the CPU has no fused kernel worth it."""
    return bool(params) and all(p.device.type == "cuda" for p in params)


def _available(torch: Any, kind: str) -> bool:
    backend = getattr(torch, kind, None) or getattr(torch.backends, kind, None)
    check = getattr(backend, "is_available", None)
    return bool(check()) if callable(check) else False


def set_threads(threads: int) -> None:
    """torch's CPU threads (0 keeps its default). More than this process may run on is refused: it only
    makes the threads wait for each other, and thousands fail to start at all."""
    import torch

    if not threads:
        return
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if threads > cpus:
        raise ConfigError(
            f"train.threads {threads}: this process may use {cpus} CPUs; use at most {cpus} (0: torch's default)"
        )
    torch.set_num_threads(threads)


@contextlib.contextmanager
def out_of_memory_is_a_config_error(what: str) -> Iterator[None]:
    """A model too large for this machine (loading it, adding LoRA, copying it) is one line, not a traceback."""
    try:
        yield
    except MemoryError:
        raise ConfigError(f"{what}: not enough memory on this machine") from None
    except RuntimeError as exc:  # torch: "can't allocate memory", "CUDA out of memory", "size ... overflowed"
        first = (str(exc).strip().splitlines() or [""])[0]
        if not _OUT_OF_MEMORY.search(first):
            raise
        raise ConfigError(f"{what}: not enough memory on this machine ({first[:200]})") from None


def pinned(model: ModelConfig) -> ModelConfig:
    """``model`` with the links in its path resolved (``outputs/sft/final`` → that run's checkpoint
    folder): a run keeps the model it started from when the link moves, as ``final`` does when
    its SFT run is resumed. A relative path stays relative."""
    if model.path is None:
        return model
    path = Path(model.path).expanduser()
    if not path.exists() or os.path.realpath(path) == os.path.abspath(path):
        return model
    real = os.path.realpath(path)
    return dataclasses.replace(model, path=real if path.is_absolute() else os.path.relpath(real))


def start_from(run_dir: Path, resume: bool, steps: int) -> tuple[Path | None, dict[str, Any] | None]:
    """The checkpoint a run continues from and its trainer state; ``(None, None)`` to start at step 0.

    A new run needs an empty (or absent) ``run_dir``. ``--resume`` of a run that stopped before its
    first checkpoint (a NaN at step 1, Ctrl-C) starts it over in its folder with its saved config."""
    if not resume:
        if run_dir.exists() and not run_dir.is_dir():
            raise ConfigError(f"output.dir {run_dir} is a file, not a folder")
        if run_dir.is_dir() and any(run_dir.iterdir()):
            if (run_dir / CONFIG_FILE).is_file() and ckpt.latest_checkpoint(run_dir) is None:
                raise ConfigError(
                    f"output.dir {run_dir} is not empty: it holds a run that stopped before its first "
                    f"checkpoint; start it over with --resume {run_dir} (overrides allowed), or choose another"
                )
            raise ConfigError(
                f"output.dir {run_dir} is not empty: resume it with --resume, or choose another"
            )
        return None, None
    return find_checkpoint(run_dir, steps)


def find_checkpoint(run_dir: Path, steps: int) -> tuple[Path | None, dict[str, Any] | None]:
    """The checkpoint a resumed run of ``steps`` steps continues from, and its trainer state;
    ``(None, None)`` for a run folder with no checkpoint yet (it starts over)."""
    checkpoint = ckpt.latest_checkpoint(run_dir)
    if checkpoint is None:
        if (run_dir / CONFIG_FILE).is_file():
            return None, None
        raise ConfigError(f"--resume {run_dir}: no complete checkpoint to resume from")
    try:
        state = ckpt.load_state(checkpoint)
        step = int(state["step"])
    except Exception as exc:  # noqa: BLE001 - a damaged file of any kind: say which, and what to do
        raise ConfigError(
            f"--resume: {checkpoint / ckpt.STATE_FILE} cannot be read ({type(exc).__name__}); "
            "move that checkpoint folder away to resume from the one before"
        ) from None
    if step >= steps:
        raise ConfigError(f"--resume: the run is at step {step} already; raise train.steps to go on")
    return checkpoint, state


def check_resumable(checkpoint: Path | None, lora: bool) -> None:
    """A checkpoint continues only the kind of run that saved it: a LoRA run's holds an adapter and
    an optimizer state of the adapter's weights, a full fine-tuning run's the whole model's. (The
    world size does not matter: every checkpoint holds the whole model and optimizer state.)"""
    if checkpoint is None:
        return
    saved = (checkpoint / ADAPTER_DIR).is_dir()
    if saved != lora:
        kinds = {True: "a LoRA run", False: "a full fine-tuning run"}
        raise ConfigError(
            f"--resume: {checkpoint} was saved by {kinds[saved]} and this config is {kinds[lora]} "
            f"(lora.enabled {str(lora).lower()}); resume with lora.enabled {str(saved).lower()}"
        )


@contextlib.contextmanager
def first_writes(run_dir: Path, *, new: bool) -> Iterator[None]:
    """The block that writes a run folder's first files. If it fails, a ``new`` run's folder is left
    as it was found (absent or empty), and a failed write (a full disk) is one line."""
    existed = run_dir.exists()
    try:
        yield
    except BaseException as exc:
        if new:
            if existed:  # it was empty (checked): everything in it is this run's
                for child in run_dir.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
            else:
                shutil.rmtree(run_dir, ignore_errors=True)
        if isinstance(exc, OSError):
            raise write_failed(exc, None, path=None if exc.filename else run_dir) from None
        raise


def optimizer_and_schedule(
    model: Any, optim: OptimConfig, updates: int, state: Any, params: list[Any] | None = None
) -> tuple[Any, Any, int]:
    """AdamW over the trainable parameters (``params``, else the model's), its learning-rate schedule
    over ``updates`` optimizer steps, and the step to start from: restored from a checkpoint's
    ``state`` (RNG included), if any."""
    import torch

    if params is None:
        params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=optim.lr,
        betas=optim.betas,
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        **({"fused": True} if fused_adamw(params) else {}),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: lr_factor(k, optim, updates))
    if state is None:
        return optimizer, scheduler, 0
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (ValueError, KeyError) as exc:  # torch: "... doesn't match the size of optimizer's group"
        raise ConfigError(
            f"--resume: the checkpoint's optimizer state does not fit this model's trainable weights "
            f"({exc}); was it saved with another model or LoRA configuration?"
        ) from None
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
