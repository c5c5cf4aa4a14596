"""RL rollouts on Ray workers (``sampler.executor = "ray"`` or ``"ray=ADDRESS"``): the eval path's
``RayExecutor`` (``palaestra/eval/ray_executor.py``), run for every step of the run.

The trainer is the driver. The workers load the environment by name and arguments, as
``palaestra eval --executor ray`` workers do, and reach the remote sampler's server by its URL
with the sampler's own client settings (every request asks for the token ids and logprobs the
trainer trains on; ``PALAESTRA_API_KEY``, when the driver has one, is read on each worker's node).
Each step's groups go to them whole; each call carries the step's seed and the model name of the
policy version synced last, so a step's batch is the one the trainer's process would sample (the
rollouts depend on the seed, the example and the rollout index only). A worker that dies has its
unfinished groups run again on another one, and a new worker takes its place (at most
``workers`` times in a run): a group counts once, from the one call that returned it.

The workers stay up from the first step to the last (a cluster started here stops with the run).

Under torchrun, rank 0 alone is the driver: it has the workers roll out every group of the step,
the other ranks take an empty share, and the ranks' exchange of their rollouts gives every rank
the whole batch (``rl.py``), as when each rank samples its own share. A refusal while the workers
start is rank 0's, and every rank stops with it.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from palaestra.eval.ray_executor import ExecutorError, RayExecutor, check_address, import_ray
from palaestra.train.config import ConfigError
from palaestra.train.distributed import World
from palaestra.train.samplers.failures import after_rank_0
from palaestra.types import RunSpec

if TYPE_CHECKING:
    from palaestra.train.rl_config import RLConfig, SamplerConfig
    from palaestra.train.samplers.remote import RemoteSampler

OPTION = "sampler.executor"


def check_ray(section: SamplerConfig) -> None:
    """What can be refused before the model loads: no Ray, an address where nothing listens."""
    if section.executor == "local":
        return
    try:
        import_ray(OPTION)
        if section.ray_address is not None:
            check_address(section.ray_address, option=OPTION)
    except ExecutorError as exc:
        raise ConfigError(str(exc)) from None


async def ray_executor(config: RLConfig, sampler: RemoteSampler, world: World) -> RayExecutor | None:
    """The executor ``sampler.executor`` asks for, its workers started and their environment
    loaded (None: this process samples; under torchrun, every rank but rank 0). Bad input is a
    ``ConfigError`` (one line, rank 0's on every rank): no Ray, an address where no cluster
    answers, more workers than CPUs, a node without the environment."""
    if config.sampler.executor == "local":
        return None
    if world.size == 1:
        return await _started(config, sampler)
    executor, problem = None, None
    if world.main:
        try:
            executor = await _started(config, sampler)
        except ConfigError as exc:
            problem = str(exc)
    problem = await asyncio.to_thread(world.broadcast, problem)
    if problem is not None:
        await asyncio.to_thread(after_rank_0, world)  # rank 0 says it, then the others stop
        raise ConfigError(problem)
    return executor


async def _started(config: RLConfig, sampler: RemoteSampler) -> RayExecutor:
    from palaestra.cli.common import ClientOptions
    from palaestra.train.samplers.remote import API_KEY_VAR

    section = config.sampler
    client = ClientOptions(
        sampler.client.model,  # each call names the version synced last (follow_model)
        base_url=sampler.url,
        api_key_var=API_KEY_VAR,
        no_api_key=not os.environ.get(API_KEY_VAR),
        timeout=section.timeout,
        max_retries=sampler.client.max_retries,
        extra_body={"return_token_ids": True},
    )
    spec = RunSpec(
        rollouts_per_example=config.train.rollouts_per_example,
        max_concurrent=config.train.max_concurrent,
        sampling=config.sampling.as_sampling(),
    )
    try:
        executor = RayExecutor(
            config.env.id,
            config.env.args,
            client,
            address=section.ray_address,
            workers=section.workers or None,
            keep_workers=True,
            follow_model=True,
            option=OPTION,
            workers_option="sampler.workers",
        )
    except ExecutorError as exc:
        raise ConfigError(str(exc)) from None
    try:
        await executor.start(spec)
    except ExecutorError as exc:
        executor.close()
        raise ConfigError(str(exc)) from None
    return executor
