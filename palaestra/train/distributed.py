"""Data-parallel training across processes: the world torchrun starts, each rank's share of a
step, and the sums that make N ranks take the very step one process would.

``torchrun --nproc-per-node N -m palaestra train sft|rl CONFIG`` (or ``palaestra train ... --nproc
N``, which runs torchrun) starts N copies of the trainer. Each reads its rank from the variables
torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) and joins one process group: NCCL when
the trainer is on CUDA (one GPU per rank, ``cuda:LOCAL_RANK``), gloo on the CPU.

Every rank holds the whole model and optimizer and takes its share of each step's batch
(``World.share``). The loss of a step is normalised over the *global* batch (the trained
tokens and rollouts of all ranks), each rank backpropagates its share, and ``sync_gradients``
sums the gradients over the ranks with one all-reduce: the summed gradient is the one-process
gradient, so clipping and the optimizer step are the same on every rank and the weights stay
identical. This is the synchronisation DDP does, done once per step after the micro-batches
rather than inside ``backward``: the trainers run the model's body and its output layer
separately (the output layer on trained positions only) and backpropagate a shared prompt
prefix after the rows, which a ``DistributedDataParallel`` wrapper's hooks would not see.

With ``train.fsdp`` (``fsdp.py``) the optimizer state, and the weights and gradients it steps on,
are sharded over the ranks; the passes run on the gathered weights, and the sum is the same,
landing in each rank's shards.

Only rank 0 writes (the run folder, logs, checkpoints, samples) and runs the held-out
evaluations. A checkpoint is the same at any world size (the whole model, the whole optimizer
state), so a run saved at N ranks resumes at any other N.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from palaestra.train.common import TrainingError
from palaestra.train.config import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the training processes; ``World()`` is the one-process run."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Whether this rank writes and evaluates (rank 0)."""
        return self.rank == 0

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous share of ``items`` (rank 0's first: the shares in rank order are
        ``items``). They are equal when the world size divides the count (``check_shares``), as it
        does for a whole step; the smaller last step of an SFT epoch may leave a rank fewer, or none."""
        n = len(items)
        return list(items[self.rank * n // self.size : (self.rank + 1) * n // self.size])

    def deal(self, items: Sequence[T], key: Callable[[T], int]) -> list[T]:
        """The items this rank takes when they are dealt round-robin by ``key`` (``key % size == rank``):
        items with one key (the rows of one rollout) stay on one rank."""
        return [item for item in items if key(item) % self.size == self.rank]

    def sum(self, values: Sequence[float]) -> list[float]:
        """``values`` summed element-wise over the ranks (float64, so sums of counts stay exact)."""
        if self.size == 1:
            return [float(v) for v in values]
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_device())
        with _collective():
            dist.all_reduce(tensor)
        return [float(v) for v in tensor.cpu()]

    def max(self, value: float) -> float:
        """The largest of every rank's ``value``."""
        if self.size == 1:
            return float(value)
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([float(value)], dtype=torch.float64, device=_device())
        with _collective():
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    def gather(self, items: list[T]) -> list[T]:
        """Every rank's ``items``, concatenated in rank order, on every rank (pickled: small data only)."""
        if self.size == 1:
            return list(items)
        import torch.distributed as dist

        parts: list[Any] = [None] * self.size
        with _collective():
            dist.all_gather_object(parts, items)
        return [item for part in parts for item in part]

    def broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank (pickled: small data only)."""
        if self.size == 1:
            return value
        import torch.distributed as dist

        box: list[Any] = [value]
        with _collective():
            dist.broadcast_object_list(box, src=0)
        shared: T = box[0]
        return shared

    def barrier(self) -> None:
        """Wait until every rank gets here (before rank 0's first write: every rank has checked)."""
        if self.size > 1:
            import torch.distributed as dist

            with _collective():
                dist.barrier()


def world_from_env() -> World:
    """The world torchrun describes in this process's environment; ``World()`` without torchrun."""
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as exc:
        raise ConfigError(f"WORLD_SIZE, RANK and LOCAL_RANK must be integers ({exc})") from None
    if size < 1 or not 0 <= rank < size:
        raise ConfigError(f"RANK {rank} is not within WORLD_SIZE {size}")
    return World(rank=rank, size=size, local_rank=local_rank)


def check_divides(count: int, world: World, what: str) -> None:
    """Refuse a batch the ranks cannot share equally (every rank must take the same number of items)."""
    if count % world.size:
        raise ConfigError(
            f"{what} ({count}) is not divisible by the world size ({world.size} processes): "
            f"use a multiple of {world.size}, or another number of processes"
        )


def check_shares(train: Any, world: World) -> None:
    """Refuse a step the ranks cannot share equally: SFT's ``batch_size`` conversations, or RL's
    groups (``batch_size / rollouts_per_example``; a group is never split across ranks)."""
    per_group = getattr(train, "rollouts_per_example", None)
    if per_group is None:
        check_divides(train.batch_size, world, "train.batch_size")
    else:
        what = "the groups of a step (train.batch_size / train.rollouts_per_example)"
        check_divides(train.batch_size // per_group, world, what)


def join(world: World, device: Any) -> Any:
    """Join the process group (NCCL on CUDA, gloo on the CPU) and return this rank's device: with
    CUDA, its own GPU ``cuda:LOCAL_RANK``."""
    if world.size == 1:
        return device
    import torch
    import torch.distributed as dist

    if device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def leave(world: World) -> None:
    """Leave the process group (at the end of a run, or when it stops)."""
    if world.size > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def broadcast_parameters(model: Any, world: World) -> None:
    """Rank 0's weights on every rank: they must start identical (as DDP makes them)."""
    if world.size == 1:
        return
    import torch
    import torch.distributed as dist

    with torch.no_grad(), _collective():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def sync_gradients(params: Iterable[Any], world: World) -> None:
    """Sum every trainable parameter's gradient over the ranks, in one all-reduce.

    A parameter without a gradient on this rank (it trained nothing this step) contributes zeros:
    every rank must take part in the same collective."""
    if world.size == 1:
        return
    import torch
    import torch.distributed as dist

    params = list(params)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    with _collective():
        dist.all_reduce(flat)
    for p, g in zip(params, flat.split([g.numel() for g in grads]), strict=True):
        p.grad = g.view_as(p).clone()


@contextlib.contextmanager
def _collective() -> Iterator[None]:
    """A collective whose peer is gone (killed, its node lost) is one line: the run stops (torchrun
    stops the other ranks too) and resumes from its last checkpoint."""
    try:
        yield
    except RuntimeError as exc:  # gloo's "Connection reset by peer", NCCL's errors, a timeout
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise TrainingError(
            f"another training process is gone ({first}); the run stops: resume it from its last "
            "checkpoint with --resume RUN_DIR"
        ) from None


def _device() -> Any:
    """Where collectives of small values run: the GPU under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class NullLog:
    """The metrics log of ranks other than 0: they write nothing (``MetricsLog``'s interface)."""

    def write(self, record: dict[str, Any]) -> None:
        """Rank 0 writes the step's record."""

    def __enter__(self) -> NullLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``python -m palaestra ARGV`` on ``nproc`` processes of this machine, as ``torchrun
    --standalone --nproc-per-node NPROC`` would, and return the exit status of the first process
    that failed (each process prints its own errors; rank 0's are the ones shown)."""
    import logging
    import sys
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the ranks print their own errors; the launcher's report of the failed rank would be a second line
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
    )
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", "palaestra", *argv)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode > 0:
            return failure.exitcode
        print(
            f"palaestra: error: rank {rank} was killed by {failure.signal_name()}; the others were "
            "stopped (resume from the last checkpoint with --resume RUN_DIR)",
            file=sys.stderr,
        )
        return 1
    return 0
