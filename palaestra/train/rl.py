"""The RL trainer: roll out groups of episodes, score them, push the policy toward the better ones.

One step, top to bottom (``_train``):

1. take the next ``batch_size / rollouts_per_example`` examples in dataset order, so the
   stratified difficulty an environment builds into consecutive examples holds in every batch;
2. roll out ``rollouts_per_example`` episodes of each with the current policy through the engine
   ``palaestra eval`` uses, scored by the environment's own rubric;
3. advantages: reward − the group's mean; groups whose rewards are all equal carry no signal and
   are skipped (and counted);
4. update on exactly the token ids the sampler produced, with the loss's ratios taken against
   the sampler's logprobs; the new weights reach the sampler before it samples again
   (``Sampler.sync``): the local sampler shares the trained module, so nothing is copied; a
   remote one (vLLM, ``palaestra serve``) gets a LoRA adapter or a reload per version;
5. log, save a sample of the batch's rollouts as a run ``palaestra report`` opens, checkpoint,
   and play the held-out sets every ``eval.every`` steps (``rl_records.py``).

Departures from GRPO as published (DeepSeekMath), on purpose: advantages are not divided by the
group's std unless asked (Dr. GRPO); the default loss is CISPO, which never zeroes a token's
gradient; ratios are taken against the sampler, not a recomputed old policy; there is no KL
penalty unless ``loss.kl_beta`` > 0 (then the starting model is kept as the reference).

Off-policy steps, when asked (``train.max_off_policy_steps`` = k > 0, a remote sampler): the
batches of the next k steps are sampled while this one trains (``off_policy.py``), so a batch
may come from weights up to k updates old (never more; each step logs by how many). The
sampler-vs-trainer mismatch is logged every step (``mismatch/...``) and, when asked (``loss.tis_cap``,
``loss.mis``), corrected by truncated or masked importance weights, the loss's ratios then taken
against the trainer's own logprobs before the update (``mismatch.py``).

Under torchrun (``distributed.py``), each rank samples its share of the step's groups, with its
own copy of the policy or from the one remote server (rank 0 owns it and pushes the weights; the
others wait for each push: ``samplers/remote.py``); off-policy, rank 0 samples every group ahead
and tells the others when it pushes (``off_policy.py``); the ranks exchange their rollouts, so
advantages, logs and samples are the whole batch's; each rank then updates on every N-th rollout
with the batch's token weights and the gradients are summed: N ranks take the one-process step.
Only rank 0 writes and evaluates. With ``train.fsdp`` (``fsdp.py``) the optimizer state, and the
weights and gradients it steps on, are sharded over the ranks. The local sampler generates with
the full weights on each rank, gathered whole again after each update: no collective inside
generation. For a remote sampler every rank takes part in gathering the whole weights before each
push, and rank 0 writes them as a run without FSDP writes its model's.

With ``sampler.executor = "ray"`` the groups of a step are rolled out by Ray workers that reach
the remote server by URL (``samplers/ray_rollouts.py``, the eval path's ``RayExecutor``); the
trainer gets every group back scored, with its token ids and logprobs, and trains as above. Under
torchrun rank 0 drives the workers for the whole batch and the exchange gives it to the others.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import time
from pathlib import Path

from palaestra.eval.ray_executor import RayExecutor
from palaestra.train import checkpoint as ckpt
from palaestra.train import fsdp
from palaestra.train.advantages import group_advantages
from palaestra.train.common import (
    CONFIG_FILE,
    TrainingError,
    check_resumable,
    diverged,
    first_writes,
    optimizer_and_schedule,
    out_of_memory_is_a_config_error,
    pick_device,
    pinned,
    point_final,
    set_threads,
    start_from,
    use_bf16,
    writes_stop_the_run,
)
from palaestra.train.config import ConfigError, load_config, to_toml
from palaestra.train.curves import write_curves
from palaestra.train.data import message_texts
from palaestra.train.distributed import (
    NullLog,
    World,
    broadcast_parameters,
    check_shares,
    join,
    leave,
    world_from_env,
)
from palaestra.train.losses import LossConfig
from palaestra.train.metrics import MetricsLog
from palaestra.train.model import (
    ADAPTER_DIR,
    add_lora,
    backbone_and_head,
    enable_gradient_checkpointing,
    load_adapter,
    load_model,
    parameter_counts,
)
from palaestra.train.off_policy import Batches
from palaestra.train.policy_update import Diverged, policy_update
from palaestra.train.rl_config import RLConfig
from palaestra.train.rl_records import RLProgress, evaluate_sets, sample_metadata, save_run, step_record
from palaestra.train.rl_rollouts import check_template, collect, load_env, step_examples
from palaestra.train.rollout_tokens import TokenError, batch_sequences, cut_to_length
from palaestra.train.samplers.base import Sampler
from palaestra.train.samplers.failures import check_batch, check_not_all_failed, every_rank, sampler_failures
from palaestra.train.samplers.local import LocalSampler
from palaestra.train.samplers.ray_rollouts import check_ray, ray_executor
from palaestra.train.samplers.remote import RemoteSampler
from palaestra.train.sft_config import ModelConfig
from palaestra.types import Rollout, RunSpec, derive_seed


def train_rl(config: RLConfig, *, resume: str | Path | None = None, progress: bool | None = None) -> Path:
    """Train as ``config`` says (or continue the run in ``resume``); returns the run folder."""
    from palaestra.runner import run_async

    world = world_from_env()  # one process, or one rank of torchrun's
    check_shares(config.train, world)  # a group is never split across ranks
    check_ray(config.sampler)  # no Ray, no cluster at the address: refused before the model loads
    try:
        return run_async(_train(config, Path(resume) if resume is not None else None, progress, world))
    finally:
        leave(world)


async def _train(config: RLConfig, resume: Path | None, progress: bool | None, world: World) -> Path:
    import torch

    # -- check the input and load everything, before any work --------------------------------------
    config = dataclasses.replace(config, model=pinned(config.model))  # an SFT run's final -> its checkpoint
    run_dir = resume or Path(config.output.dir)
    checkpoint, state = start_from(run_dir, resume is not None, config.train.steps)
    check_resumable(checkpoint, config.lora.enabled)
    set_threads(config.train.threads)
    device = join(world, pick_device(config.train.device))
    bf16 = use_bf16(config.train.mixed_precision, device)
    torch.manual_seed(config.train.seed)
    env = load_env(config.env.id, config.env.args, "env.args")
    eval_envs = [(s.name, load_env(config.env.id, s.args, f"eval.sets {s.name}")) for s in config.eval.sets]
    model_config = config.model
    if checkpoint is not None and not config.lora.enabled:  # full fine-tuning resumes from the saved weights
        model_config = ModelConfig(path=str(checkpoint), attn_implementation=config.model.attn_implementation)
    with out_of_memory_is_a_config_error(f"model {model_config.path or 'tiny'}"):
        model, tokenizer = load_model(
            model_config,
            lambda: message_texts((e.prompt for e in env.examples), (env.tools for _ in env.examples)),
            device=device,
        )
        check_template(tokenizer, env)
        reference = None
        if config.loss.kl_beta > 0:
            reference = backbone_and_head(copy.deepcopy(model).eval().requires_grad_(False))
        if config.lora.enabled:
            model = (
                load_adapter(model, checkpoint / ADAPTER_DIR) if checkpoint else add_lora(model, config.lora)
            )
    if config.train.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    broadcast_parameters(model, world)  # every rank starts from rank 0's weights
    # the local sampler generates with the model between updates (the layer mode gathers it whole then)
    local = config.sampler.kind == "local"
    shards = fsdp.shard(model, world, device, config.train.fsdp, sampling=local)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sampler: Sampler
    executor: RayExecutor | None = None  # None: the groups are rolled out in this process
    if local:
        sampler = LocalSampler(model, tokenizer, max_batch_size=config.train.max_concurrent)
    else:  # with FSDP, every rank gathers the whole weights for each of rank 0's pushes
        sampler = RemoteSampler.of_run(config, model, tokenizer, run_dir, world, shards)
        await sampler.check_reachable()  # an external server that is not there: refused before any write
        executor = await ray_executor(config, sampler, world)  # no Ray, no cluster: refused here too
    trainable, total = parameter_counts(model)
    say = print if progress is not False and world.main else (lambda *_: None)
    groups_per_step = config.train.batch_size // config.train.rollouts_per_example
    say(
        f"env: {config.env.id}, {len(env.examples)} examples, {groups_per_step} groups of "
        f"{config.train.rollouts_per_example} per step\nmodel: {config.model.path or 'tiny'}, "
        f"{total / 1e6:.2f}M parameters, {trainable / 1e6:.2f}M trainable; {device.type}"
        f"{', bf16 autocast' if bf16 else ''}; sampler {config.sampler.kind}"
        f"{f', rollouts on {len(executor.live)} Ray workers' if executor else ''}\n"
        f"run: {run_dir}, {config.train.steps} steps, loss {config.loss.name}"
        f"{fsdp.processes(world, config.train.fsdp)}"
    )

    # -- optimizer, learning-rate schedule, state of a resumed run --------------------------------
    opt = config.optim
    updates = config.train.steps * config.train.update_passes
    resumed = shards.shard_state(state) if shards else state  # its optimizer state cut to the shards
    params = shards.params if shards else None
    optimizer, scheduler, start = optimizer_and_schedule(model, opt, updates, resumed, params=params)
    backbone, head = backbone_and_head(model)
    loss_config = LossConfig(
        name=config.loss.name,
        eps_low=config.loss.eps_low,
        eps_high=config.loss.eps_high,
        mask_low=config.loss.mask_low,
        mask_high=config.loss.mask_high,
        kl_beta=config.loss.kl_beta,
        max_tokens=config.sampling.max_tokens,
    )
    mismatch = config.loss.mismatch()
    sampling = config.sampling.as_sampling()
    world.barrier()  # every rank has checked its input: rank 0 may write
    # after every check, so a refusal writes nothing; only rank 0's files are removed if this fails
    with first_writes(run_dir, new=resume is None and world.main):
        try:
            await sampler.start(start)  # a server that cannot serve what training needs: refused here
            if world.main:
                run_dir.mkdir(parents=True, exist_ok=True)
                (run_dir / CONFIG_FILE).write_text(to_toml(config))
        except BaseException:
            await sampler.aclose()  # a server it started stops with it
            if executor is not None:
                executor.close()
            raise
    log = MetricsLog(run_dir, after_step=start, config=config) if world.main else NullLog()
    show = RLProgress(
        config.train.steps,
        done=start,
        log_every=config.output.log_every,
        plain=None if progress else True,
        quiet=progress is False or not world.main,
    )
    last_saved = checkpoint
    model.eval()

    # rank 0 alone rolls out the whole batch when Ray workers do or batches are sampled ahead: its
    # pushes then follow its own view of when the sampler is idle, which the other ranks are told
    ahead = config.train.max_off_policy_steps
    alone = config.sampler.executor != "local" or ahead > 0  # "ray" or "ray=ADDRESS"
    # the ranks' requests to one remote server: train.max_concurrent in flight in all
    in_flight = config.train.max_concurrent
    if not local and not alone:
        in_flight = math.ceil(in_flight / world.size)

    def step_spec(step: int) -> RunSpec:
        return RunSpec(
            rollouts_per_example=config.train.rollouts_per_example,
            max_concurrent=in_flight,
            sampling=sampling,
            seed=derive_seed("palaestra/rl", config.train.seed, step),
        )

    async def sample(step: int) -> list[Rollout]:
        examples = step_examples(env.examples, step, groups_per_step)
        if not alone:
            examples = world.share(examples)  # this rank's groups
        elif not world.main:
            examples = []  # rank 0 (or its Ray workers) rolls out every group
        return await collect(env, sampler.client, examples, step_spec(step), executor)

    async def rank_0_says(idle: bool) -> bool:
        return bool(await asyncio.to_thread(world.broadcast, idle))

    agree = rank_0_says if world.size > 1 and ahead else None
    batches = Batches(sampler, sample, ahead=ahead, steps=config.train.steps, version=start, agree=agree)
    try:
        with show, log, writes_stop_the_run(lambda: last_saved):
            if start == 0 and eval_envs and world.main:  # where the policy starts from
                async with sampler_failures(0, sampler, last_saved), batches.newest():
                    log.write(
                        {"step": 0, **await evaluate_sets(eval_envs, sampler.client, config, run_dir, 0)}
                    )

            # -- the loop ---------------------------------------------------------------------------
            for step in range(start, config.train.steps):
                t0, started = time.perf_counter(), time.gmtime()
                # a sampler gone for any rank stops them all at this step
                async with (
                    every_rank(world, step + 1, sampler, last_saved),
                    sampler_failures(step + 1, sampler, last_saved),
                ):
                    batch, waited = await batches.take(step)  # sampled by policy version batch.version
                    await check_batch(batch.rollouts, step + 1, sampler, last_saved)
                    # k > 0: the next steps' batches are sampled while this one trains
                    await batches.sample_ahead(step)
                # the whole batch, every rank's groups, in the order one process has them (``collect``)
                rollouts = sorted(world.gather(batch.rollouts), key=lambda r: (r.example_id, r.rollout_index))
                check_not_all_failed(rollouts, step + 1, world, last_saved)  # nothing to learn from
                t_sampled = time.perf_counter()
                advantages = group_advantages(rollouts, scale=config.loss.advantage_scale)
                learn = [
                    (r, a)
                    for r, a in zip(advantages.rollouts, advantages.values, strict=True)
                    if r.example_id not in advantages.flat
                ]
                try:
                    sequences = batch_sequences([r for r, _ in learn], [a for _, a in learn])
                except TokenError as exc:
                    raise TrainingError(f"step {step + 1}: {exc}") from None
                sequences, cut = cut_to_length(sequences, config.train.max_length)
                stats = None
                if sequences:
                    async with sampler.updating():
                        try:
                            stats = await asyncio.to_thread(
                                policy_update,
                                model,
                                head,
                                backbone,
                                optimizer,
                                scheduler,
                                world.deal(sequences, key=lambda s: s.rollout),  # this rank's rollouts
                                loss_config,
                                passes=config.train.update_passes,
                                micro_batch_tokens=config.train.micro_batch_tokens,
                                max_grad_norm=opt.max_grad_norm,
                                device=device,
                                bf16=bf16,
                                pad_id=pad_id,
                                temperature=config.sampling.temperature,
                                reference=reference,
                                mismatch=mismatch,
                                world=world,
                                share_prefix=config.train.share_prefix,
                                shards=shards,
                            )
                        except Diverged as exc:
                            raise diverged(step + 1, exc.what, exc.value, last_saved) from None
                batches.trained_to(step + 1)  # the sampler gets these weights before it samples again
                t_trained = time.perf_counter()
                record = step_record(
                    step + 1,
                    rollouts,
                    advantages,
                    stats,
                    float(scheduler.get_last_lr()[0]),
                    batch.seconds,
                    t_trained - t_sampled,
                    parser=env.parser,
                )
                record.update(cut_sequences=cut, policy_version=batch.version, seconds=t_trained - t0)
                record.update(off_policy_steps=step - batch.version, seconds_waiting=waited)
                record["seconds_sync"], batches.sync_seconds = batches.sync_seconds, 0.0
                done = step + 1 == config.train.steps
                evaluates = done or (config.eval.every and (step + 1) % config.eval.every == 0)
                if eval_envs and evaluates:  # every rank: the push of the newest weights is every rank's
                    async with (
                        every_rank(world, step + 1, sampler, last_saved),
                        sampler_failures(step + 1, sampler, last_saved),
                        batches.newest(),
                    ):
                        if world.main:
                            record.update(
                                await evaluate_sets(eval_envs, sampler.client, config, run_dir, step + 1)
                            )
                log.write(record)
                show.update(record)
                every = config.output.sample_every
                if world.main and every and ((step + 1) % every == 0 or done):
                    keep = config.output.sample_groups * config.train.rollouts_per_example
                    name = f"step-{step + 1:06d}"
                    header = sample_metadata(
                        rollouts[:keep], config, step_spec(step), name, version=batch.version, started=started
                    )
                    save_run(run_dir / "samples" / name, rollouts[:keep], header)
                saves = done or (config.output.save_every and (step + 1) % config.output.save_every == 0)
                full = shards.full_state(optimizer) if shards and saves else None  # every rank: a collective
                if world.main and saves:
                    last_saved = ckpt.save_checkpoint(
                        run_dir,
                        step + 1,
                        model=model,
                        tokenizer=tokenizer,
                        optimizer=optimizer,
                        scheduler=scheduler,
                        extra={},
                        full=full,
                    )
                    write_curves([run_dir], run_dir / "curves.html")
                    show.note(f"checkpoint: {last_saved}")
    finally:
        await batches.aclose()
        await sampler.aclose()
        if executor is not None:
            executor.close()  # the workers, and a cluster started for the run
        for each in {id(e): e for e in [env, *(e for _, e in eval_envs)]}.values():
            await each.aclose()
    if not world.main:
        return run_dir
    final = point_final(run_dir, last_saved) if last_saved is not None else run_dir
    say(f"done: {final} (curves: {run_dir / 'curves.html'})")
    return run_dir


def resume_config(run_dir: str | Path, overrides: dict[str, str] | None = None) -> RLConfig:
    """The config a run was started with (``RUN_DIR/config.toml``), with ``overrides`` on top."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"--resume {run_dir}: no {CONFIG_FILE} there; is it an RL run folder?")
    return load_config(RLConfig, path, overrides)
