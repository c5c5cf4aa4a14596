"""Rollouts on a Ray cluster: workers run the engine for the groups the driver hands them.

``palaestra eval ... --executor ray`` starts a local Ray cluster; ``--executor ray=ADDRESS``
(``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``) joins a running one. The driver is the
``palaestra eval`` process: it hands each worker whole groups, a few at a time, gets each group
back scored, and alone writes ``results.jsonl`` and the metadata (``palaestra.eval.run``), so
saving, the summary and ``--resume`` are exactly those of a one-process run.

- A worker is a Ray actor (``RolloutWorker``), one per process, spread over the cluster's nodes.
  It loads the environment itself, by name and arguments (its entry point, as
  ``palaestra.load_environment`` finds it: nothing is pickled but data), and builds its own model
  client from the run's client options. A node without the environment's package is one line
  naming the environment and the node.
- A group never splits: all its rollouts run on one worker, whose client sends them to one
  endpoint (``RoutedClient``'s stickiness), so a server's prefix cache serves the group's prompt.
  The group's reward functions run there, on the whole group.
- Each worker gets ``max_concurrent / workers`` request slots (rounded up), so ``-c`` bounds the
  requests of the whole run, as it does in one process.
- A worker that dies (killed, its node lost) loses only its unfinished groups: each is handed
  to another worker, and a new worker takes the dead one's place (at most ``workers`` times in a
  run). A group is saved only from the one call that returned it, so nothing is lost and nothing
  is saved twice; rollouts depend on the seed, the example and the rollout index only, so the
  summary is the one-process run's.

The RL trainer runs its steps' groups here too (``sampler.executor = "ray"``, in
``palaestra.train.samplers.ray_rollouts``): one executor for the whole run (``keep_workers``: the
workers stay between steps, each call carrying its step's seed), and each call naming the model
the driver's client asks for (``follow_model``: the policy version synced last).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from palaestra.clients.base import ModelClient, ModelUnavailable
from palaestra.clients.limited import LimitedClient
from palaestra.engine import groups_in_flight, run_group
from palaestra.types import Example, Rollout, RunSpec

if TYPE_CHECKING:
    from palaestra.cli.common import ClientOptions
    from palaestra.envs.base import Environment

RAY_EXTRA = "pip install 'palaestra[ray]'"


class ExecutorError(RuntimeError):
    """The executor cannot run the groups: no Ray, no cluster at the address, no worker left."""


def import_ray(option: str = "--executor") -> Any:
    """The ``ray`` module; ``ExecutorError`` naming the extra when it is not installed. ``option``:
    how the user asked for Ray, in the message (``--executor``, the RL config's ``sampler.executor``)."""
    try:
        import ray
    except ImportError:
        raise ExecutorError(f"{option} ray needs Ray: {RAY_EXTRA}") from None
    return ray


def check_address(address: str, timeout: float = 5.0, option: str = "--executor") -> None:
    """Fail fast, in one line, when nothing listens at a ``HOST:PORT`` or ``ray://HOST:PORT`` address
    (Ray itself keeps retrying for a minute); ``auto`` and a local cluster are not checked here."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ExecutorError(f"{option} ray={address}: expected auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ExecutorError(
            f"{option} ray={address}: no Ray cluster answers there ({exc.strerror or exc})"
        ) from None


class RolloutWorker:
    """One worker process: the environment and a model client of its own, the engine's groups.

    Made a Ray actor by ``RayExecutor`` (``ray.remote(RolloutWorker)``); its methods are async,
    so one worker runs many groups at once on its event loop, as one process does."""

    def __init__(self, env_id: str, env_args: dict[str, Any], client: ClientOptions, spec: RunSpec) -> None:
        self.spec = spec
        self.problem: str | None = None
        self.gave_up: Exception | None = None
        self._limited: LimitedClient | None = None
        try:
            from palaestra.cli.common import make_client
            from palaestra.registry import load_environment

            self.env = load_environment(env_id, **env_args)
            self.client: ModelClient = make_client(client, spec.max_concurrent)
        except Exception as exc:  # noqa: BLE001 - whatever stops this node: said in one line by the driver
            self.problem = (
                f"the rollout worker on node {_node()} cannot load environment {env_id!r}: "
                f"{type(exc).__name__}: {exc} (install its package on that node)"
            )

    def ready(self) -> tuple[str | None, int]:
        """What stops this worker from running groups (None: nothing), and its process id."""
        return self.problem, os.getpid()

    async def run_group(
        self, example: Example, seed: int | None = None, model: str | None = None
    ) -> list[dict[str, Any]]:
        """The scored rollouts of ``example``'s group, as saved (``Rollout.to_dict``); ``seed``
        (default: the spec's) and ``model`` (default: the client's) are the call's own."""
        if self._limited is None:  # made on the actor's own event loop
            self._limited = LimitedClient(
                self.client,
                asyncio.Semaphore(self.spec.max_concurrent),
                max_failures_in_a_row=self.spec.max_failures_in_a_row,
                on_give_up=self._give_up,
            )
        spec = self.spec
        if model is not None:  # an OpenAI client (the RL sampler's): the policy version to ask for
            self.client.model = model
        rollouts = await run_group(
            self.env,
            self._limited,
            example,
            count=spec.rollouts_per_example,
            seed=spec.seed if seed is None else seed,
            sampling=spec.sampling or self.env.sampling,
        )
        if self.gave_up is not None:
            n = spec.max_failures_in_a_row
            raise ModelUnavailable(
                f"stopped: {n} model requests in a row failed; the last with "
                f"{type(self.gave_up).__name__}: {self.gave_up}"
            )
        return [r.to_dict() for r in rollouts]

    def _give_up(self, exc: Exception) -> None:
        self.gave_up = exc


@dataclass
class WorkerStats:
    """What the executor did in its last run: for logs, tests and benchmarks."""

    started: int = 0  # workers started, replacements included
    died: int = 0
    rerun: int = 0  # groups handed to another worker after theirs died
    pids: list[int] = field(default_factory=list)  # of the live workers, in start order


class RayExecutor:
    """Runs a run's groups on ``workers`` Ray actors (``evaluate(..., executor=...)``).

    ``address``: ``None`` starts a local cluster (stopped at the end), ``"auto"`` or ``HOST:PORT``
    joins a running one; a process that is already connected (``ray.init`` called) uses its
    cluster. ``workers``: default, one per CPU of the cluster. ``keep_workers``: the workers (and
    a cluster started here) outlive a ``stream_groups`` call, for many calls, until ``close()``;
    specs that differ only in their seed share them. ``follow_model``: each group asks for the
    model the driver's client names at the call. ``option``/``workers_option``: the user's names
    for the address and the count, in messages."""

    def __init__(
        self,
        env_id: str,
        env_args: dict[str, Any],
        client: ClientOptions,
        *,
        address: str | None = None,
        workers: int | None = None,
        keep_workers: bool = False,
        follow_model: bool = False,
        option: str = "--executor",
        workers_option: str = "--workers",
    ) -> None:
        if workers is not None and workers < 1:
            raise ExecutorError(f"{workers_option} must be at least 1, got {workers}")
        self.env_id, self.env_args, self.client = env_id, env_args, client
        self.address, self.workers = address, workers
        self.keep_workers, self.follow_model = keep_workers, follow_model
        self.option, self.workers_option = option, workers_option
        self.stats = WorkerStats()
        self.live: list[Any] = []  # the live workers (actor handles)
        self._spec: RunSpec | None = None
        self._spare = 0  # replacements left for workers that die
        self.ray = import_ray(option)
        if address is not None:
            check_address(address, option=option)
        self.started_here = not self.ray.is_initialized()
        if self.started_here:  # connect now: a cluster that cannot be joined is refused before any write
            local = {} if address else {"num_cpus": max(workers or 0, os.cpu_count() or 1)}
            try:
                self.ray.init(address=address, include_dashboard=False, log_to_driver=False, **local)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise ExecutorError(f"{option} ray={address}: cannot join the cluster ({first})") from None

    async def start(self, spec: RunSpec) -> None:
        """Start the workers for runs of ``spec`` (its sampling resolved), unless they run for it
        already. A worker that cannot load the environment is an ``ExecutorError`` naming the node.
        ``stream_groups`` starts them when needed; ``palaestra eval`` does it before the run folder
        exists, so that such a node costs one line and writes nothing."""
        spec = spec.replace(seed=0)  # each call carries its seed: specs of other seeds share workers
        if self.live and spec == self._spec:
            return
        self.stop()
        ray = self.ray
        cpus = int(ray.cluster_resources().get("CPU", 0))
        count = self.workers or max(1, cpus)
        if count > cpus:  # each worker takes a CPU: the others would wait for one forever
            raise ExecutorError(
                f"{self.workers_option} {count}: the Ray cluster has {cpus} CPUs, one per worker"
            )
        self._spec, self._count, self._spare = spec, count, count
        self._per_worker = spec.replace(max_concurrent=math.ceil(spec.max_concurrent / count))
        self._actor = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(RolloutWorker)
        await asyncio.gather(*(self._start_one() for _ in range(count)))

    async def _start_one(self) -> None:
        ray = self.ray
        worker = self._actor.remote(self.env_id, self.env_args, self.client, self._per_worker)
        try:
            problem, pid = await worker.ready.remote()
        except ray.exceptions.RayActorError as exc:  # the process could not start (palaestra missing)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ExecutorError(f"a rollout worker could not start: {first}") from None
        if problem is not None:
            ray.kill(worker)
            raise ExecutorError(problem)
        self.live.append(worker)
        self.stats.started += 1
        self.stats.pids.append(pid)

    def stop(self) -> None:
        """Kill the workers (the cluster stays, unless this executor started it and a run ended)."""
        for worker in self.live:
            with contextlib.suppress(Exception):
                self.ray.kill(worker)
        self.live.clear()
        self.stats.pids.clear()

    async def stream_groups(
        self, env: Environment, client: ModelClient, examples: Sequence[Example], spec: RunSpec
    ) -> AsyncGenerator[list[Rollout], None]:
        """Yield each example's scored group as a worker returns it (``env`` and ``client`` are the
        driver's: the workers build their own from the names and options)."""
        ray, live = self.ray, self.live
        todo: deque[Example] = deque(examples)
        pending: dict[asyncio.Future[Any], tuple[Any, Example]] = {}
        model = getattr(client, "model", None) if self.follow_model else None
        try:
            await self.start(spec.replace(sampling=spec.sampling or env.sampling))
            limit = groups_in_flight(self._per_worker)  # groups in flight per worker
            while todo or pending:
                for worker in list(live):
                    while todo and sum(w is worker for w, _ in pending.values()) < limit:
                        example = todo.popleft()
                        call = worker.run_group.remote(example, spec.seed, model)
                        pending[asyncio.ensure_future(call)] = (worker, example)
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    worker, example = pending.pop(future)
                    try:
                        group = future.result()
                    except ray.exceptions.RayActorError:  # the worker is gone: its groups go elsewhere
                        todo.appendleft(example)
                        self.stats.rerun += 1
                        if worker in live:
                            self._drop(worker)
                            if self._spare > 0:
                                self._spare -= 1
                                await self._start_one()
                        if not live:
                            raise ExecutorError(
                                f"every rollout worker died ({self.stats.died}), with no replacement left"
                            ) from None
                        continue
                    except ray.exceptions.RayTaskError as exc:  # the worker's own error, as raised there
                        raise exc.as_instanceof_cause() from None
                    yield [Rollout.from_dict(row) for row in group]
        finally:
            for future in pending:
                future.cancel()
            if not self.keep_workers:
                self.close()

    def close(self) -> None:
        """Kill the workers, and stop the cluster if this executor started it."""
        self.stop()
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()

    def _drop(self, worker: Any) -> None:
        """Forget a worker that died (and make sure it is gone: an unreachable one must not go on)."""
        index = self.live.index(worker)
        self.live.pop(index)
        self.stats.pids.pop(index)
        self.stats.died += 1
        with contextlib.suppress(Exception):
            self.ray.kill(worker)


def _node() -> str:
    """This node, as a person finds it: its Ray node id (when in Ray) and its host name."""
    try:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside Ray, or an older Ray: the host name is enough
        node_id = None
    host = socket.gethostname()
    return f"{host} ({node_id[:12]})" if node_id else host
