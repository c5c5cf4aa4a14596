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
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from palaestra.eval.ray_executor import ExecutorError, RayExecutor, check_address, import_ray
from palaestra.train.config import ConfigError
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


async def ray_executor(config: RLConfig, sampler: RemoteSampler) -> RayExecutor | None:
    """The executor ``sampler.executor`` asks for, its workers started and their environment
    loaded (None: this process samples). Bad input is a ``ConfigError`` (one line): no Ray, an
    address where no cluster answers, more workers than CPUs, a node without the environment."""
    from palaestra.cli.common import ClientOptions
    from palaestra.train.samplers.remote import API_KEY_VAR

    section = config.sampler
    if section.executor == "local":
        return None
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
