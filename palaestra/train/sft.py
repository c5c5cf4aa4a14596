"""Supervised fine-tuning on the assistant turns of chat conversations: the whole loop, top to bottom.

1. Check everything that can be wrong with the input (config, data, model, LoRA targets, lengths)
   before any work, so a mistake costs one line and no compute.
2. Tokenise every conversation once, through the chat template ``LocalClient`` samples with, and
   mask everything but the assistant turns (``tokenize.py``).
3. Train: each step takes ``batch_size`` conversations in a seeded order (``batching.py``), cut
   into micro-batches that fit in memory; the loss is the mean cross-entropy over the step's
   trained tokens, and the output layer runs on those positions only (most tokens are context).
   AdamW, warm-up then a constant or cosine learning rate, gradient clipping.
4. Log every step (``metrics.jsonl``, ``curves.html``), checkpoint every ``save_every`` steps and
   at the end; a NaN or infinite loss or gradient stops the run before it touches the weights.

Under torchrun (``distributed.py``) each rank trains its share of every step's conversations, the
loss still divided by the trained tokens of the whole step, and the gradients are summed over the
ranks: N ranks take the step one process would. Only rank 0 writes the run folder. With
``train.fsdp`` the optimizer state, and the weights and gradients it steps on, are sharded over the
ranks (``fsdp.py``); the passes run on the gathered weights, and the step is the same.

``resume`` continues a run from its last checkpoint: model, optimizer, scheduler, data position
and RNG states, so the next step's loss equals the uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from pathlib import Path
from typing import Any

from palaestra.train import checkpoint as ckpt
from palaestra.train import fsdp
from palaestra.train.batching import MicroBatch, micro_batches, step_indices
from palaestra.train.common import (
    CONFIG_FILE,
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
from palaestra.train.data import Chat, load_chats, message_texts
from palaestra.train.distributed import (
    NullLog,
    World,
    broadcast_parameters,
    check_shares,
    join,
    leave,
    world_from_env,
)
from palaestra.train.metrics import MetricsLog, TrainProgress
from palaestra.train.model import (
    ADAPTER_DIR,
    add_lora,
    backbone_and_head,
    check_lora_targets,
    enable_gradient_checkpointing,
    load_adapter,
    load_model,
    parameter_counts,
)
from palaestra.train.overlap import write_train_prompts
from palaestra.train.prefix import SharedPrefix, shared_prefix_length
from palaestra.train.sft_config import ModelConfig, SFTConfig
from palaestra.train.tokenize import IGNORE, Encoded, encode, end_of_turn_ids

CURVES_FILE = "curves.html"
BASE_MODEL_DIR = "base-model"  # a tiny model's initial weights, the base a LoRA run resumes on


def train_sft(config: SFTConfig, *, resume: str | Path | None = None, progress: bool | None = None) -> Path:
    """Train as ``config`` says (or continue the run in ``resume``); returns the run folder.

    ``progress``: ``True`` for a Rich bar (plain lines when stderr is not a terminal), ``None`` for
    plain lines, ``False`` for nothing.
    """
    world = world_from_env()  # one process, or one rank of torchrun's
    check_shares(config.train, world)
    try:
        return _train_sft(config, resume, progress, world)
    finally:
        leave(world)


def _train_sft(config: SFTConfig, resume: str | Path | None, progress: bool | None, world: World) -> Path:
    import torch

    # -- 1. check the input and load everything, before any work ---------------------------------
    config = dataclasses.replace(config, model=pinned(config.model))  # final -> its checkpoint
    train, opt = config.train, config.optim
    run_dir = Path(resume if resume is not None else config.output.dir)
    checkpoint, state = start_from(run_dir, resume is not None, train.steps)
    check_resumable(checkpoint, config.lora.enabled)
    set_threads(train.threads)
    device = join(world, pick_device(train.device))
    bf16 = use_bf16(train.mixed_precision, device)
    torch.manual_seed(train.seed)
    chats = load_chats(config.data.path)
    model_config = config.model
    if checkpoint is not None and not config.lora.enabled:  # full fine-tuning resumes from saved weights
        model_config = ModelConfig(path=str(checkpoint), attn_implementation=model_config.attn_implementation)
    elif checkpoint is not None and config.model.tiny is not None:  # LoRA on a tiny model: its saved base
        model_config = ModelConfig(
            path=str(run_dir / BASE_MODEL_DIR), attn_implementation=model_config.attn_implementation
        )
    with out_of_memory_is_a_config_error(f"model {model_config.path or 'tiny'}"):
        model, tokenizer = load_model(
            model_config,
            lambda: message_texts((c.messages for c in chats), (c.tools for c in chats)),
            device=device,
        )
    examples = encode_shared(
        tokenizer, chats, config, end_of_turn_ids(tokenizer, model.generation_config), world
    )
    fingerprint = data_fingerprint(examples)
    if state is not None and state["data_fingerprint"] != fingerprint:
        raise ConfigError(
            f"--resume: the data or the tokenizer changed since the run started ({config.data.path})"
        )
    if config.lora.enabled:
        check_lora_targets(model, config.lora)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    world.barrier()  # every rank has checked its input: rank 0 may write

    # -- 2. the run folder, LoRA, the optimizer: a failure here leaves a new run's folder empty ------
    with first_writes(run_dir, new=resume is None and world.main):  # only rank 0's files to remove
        if world.main and checkpoint is None and config.model.tiny is not None:  # the base to resume LoRA on
            model.save_pretrained(run_dir / BASE_MODEL_DIR)
            tokenizer.save_pretrained(run_dir / BASE_MODEL_DIR)
        if config.lora.enabled:
            with out_of_memory_is_a_config_error("lora"):
                model = (
                    load_adapter(model, checkpoint / ADAPTER_DIR)
                    if checkpoint
                    else add_lora(model, config.lora)
                )
        if train.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        broadcast_parameters(model, world)  # every rank starts from rank 0's weights
        shards = fsdp.shard(model, world, device, train.fsdp)  # train.fsdp: 1/N of the optimizer state
        resumed = shards.shard_state(state) if shards else state  # its optimizer state cut to the shards
        optimizer, scheduler, first_step = optimizer_and_schedule(
            model, config.optim, train.steps, resumed, params=shards.params if shards else None
        )
        if world.main:
            run_dir.mkdir(parents=True, exist_ok=True)
            # eval warns of overlap with these prompts
            write_train_prompts(run_dir, (c.messages for c in chats), config.data.path)
            (run_dir / CONFIG_FILE).write_text(to_toml(config))  # last: a refused --resume keeps the old one
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if progress is not False and world.main:
        print(describe(examples, config, *parameter_counts(model), device, bf16, run_dir, world))

    # -- 3. train ----------------------------------------------------------------------------------
    backbone, head = backbone_and_head(model)
    log = MetricsLog(run_dir, after_step=first_step, config=config) if world.main else NullLog()
    show = TrainProgress(
        train.steps,
        done=first_step,
        log_every=config.output.log_every,
        plain=None if progress else True,
        quiet=progress is False or not world.main,
    )
    last_saved = checkpoint
    model.train()
    with show, log, writes_stop_the_run(lambda: last_saved):
        for step in range(first_step, train.steps):
            t0 = time.perf_counter()
            batch = [examples[i] for i in step_indices(len(examples), train.batch_size, train.seed, step)]
            trained = sum(e.trained for e in batch)  # the loss is the mean over the step's trained tokens
            shared = shared_prefix_length(batch) if train.share_prefix else 0
            mine = world.share(batch)  # this rank's conversations (all of them in one process)
            loss_value, padding = 0.0, 0.0
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                prefix = (
                    SharedPrefix(backbone, mine[0].input_ids[:shared], device) if shared and mine else None
                )
                micros = micro_batches(mine, max_tokens=train.micro_batch_tokens, pad_id=pad_id, start=shared)
                most = shards.most(len(micros)) if shards else 0  # the layer mode: as many on every rank
                for micro in micros:
                    cache = prefix.cache_for(micro.rows) if prefix else {}
                    loss = token_loss_sum(backbone, head, micro, device, cache) / trained
                    loss.backward()
                    loss_value += loss.item()
                    padding += micro.padding
                if shards:
                    shards.pad(backbone, head, device, pad_id, most - len(micros))
                if prefix:
                    prefix.backward()
            # every rank's share of the step; each rank with rows ran the shared prefix once
            loss_value, padding, prefixes = world.sum([loss_value, padding, prefix is not None])
            if not math.isfinite(loss_value):  # before any weight moves
                optimizer.zero_grad(set_to_none=True)
                raise diverged(step + 1, "loss", loss_value, last_saved)
            fsdp.sum_gradients(params, world, shards)  # the one-process gradient, on every rank
            grad_norm = fsdp.clip_gradients(params, opt.max_grad_norm or math.inf)
            if not math.isfinite(grad_norm):
                raise diverged(step + 1, "gradient norm", grad_norm, last_saved)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if shards:
                shards.gather()  # the updated weights, whole, for the next step's passes

            seconds = time.perf_counter() - t0
            tokens = sum(len(e.input_ids) for e in batch)
            computed = int(tokens - (len(batch) - prefixes) * shared + padding)  # positions the model ran on
            record = {
                "step": step + 1,
                "epoch": (step + 1) * train.batch_size / len(examples),
                "loss": loss_value,
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens": tokens,
                "trained_tokens": trained,
                "shared_prefix": shared,
                "computed_positions": computed,
                "padding_fraction": padding / computed,
                "seconds": seconds,
                "tokens_per_s": tokens / seconds,
                "trained_tokens_per_s": trained / seconds,
            }
            log.write(record)
            show.update(record)
            if step + 1 == train.steps or (
                config.output.save_every and (step + 1) % config.output.save_every == 0
            ):
                full = shards.full_state(optimizer) if shards else None  # every rank: a collective
                if world.main:
                    last_saved = ckpt.save_checkpoint(
                        run_dir,
                        step + 1,
                        model=model,
                        tokenizer=tokenizer,
                        optimizer=optimizer,
                        scheduler=scheduler,
                        full=full,
                        extra={"data_fingerprint": fingerprint},
                    )
                    write_curves([run_dir], run_dir / CURVES_FILE)
                    show.note(f"checkpoint: {last_saved}")
                world.barrier()  # no rank runs ahead of a checkpoint it could be resumed from
    if not world.main:
        return run_dir
    assert last_saved is not None  # the last step always saves
    final = point_final(run_dir, last_saved)
    if progress is not False:
        print(f"done: {final}; curves: {run_dir / CURVES_FILE}")
    return run_dir


def token_loss_sum(backbone: Any, head: Any, micro: MicroBatch, device: Any, cache: dict[str, Any]) -> Any:
    """Summed cross-entropy of the micro-batch's trained tokens; the output layer runs on those only.

    ``cache`` is ``{}`` or the shared prefix's keys and values, which the rows continue."""
    import torch.nn.functional as F

    hidden = backbone(
        input_ids=micro.input_ids.to(device),
        position_ids=micro.position_ids.to(device),
        use_cache=bool(cache),
        **cache,
    ).last_hidden_state
    targets = micro.labels[:, 1:].to(device)  # position t predicts token t + 1
    trained = targets != IGNORE
    logits = head(hidden[:, :-1][trained])
    return F.cross_entropy(logits.float(), targets[trained], reduction="sum")


def encode_shared(
    tokenizer: Any, chats: list[Chat], config: SFTConfig, end_of_turn: set[int], world: World
) -> list[Encoded]:
    """``encode_all`` with each rank tokenising its share of the conversations: every rank then has
    them all, in order, or every rank raises the first bad row's error (rank 0 prints it)."""
    start = world.rank * len(chats) // world.size  # where world.share(chats) starts
    part: list[Encoded] = []
    error = None
    try:
        part = encode_all(tokenizer, world.share(chats), config, end_of_turn, first_row=start)
    except ConfigError as exc:
        error = str(exc)
    shares = world.gather([(error, part)])
    for error, _ in shares:
        if error is not None:
            raise ConfigError(error)
    return [example for _, examples in shares for example in examples]


def encode_all(
    tokenizer: Any, chats: list[Chat], config: SFTConfig, end_of_turn: set[int], first_row: int = 0
) -> list[Encoded]:
    """Every conversation tokenised and masked; a ``max_length`` that cuts off a prompt is an error.
    ``first_row``: the data's row number of ``chats[0]`` (in the errors)."""
    max_length = config.data.max_length
    examples = []
    for i, (messages, tools) in enumerate(chats, first_row):
        try:
            example = encode(tokenizer, messages, max_length=max_length, end_of_turn=end_of_turn, tools=tools)
        except ValueError as exc:
            raise ConfigError(f"data.path: row {i}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the chat template's own errors (jinja's, of any kind)
            raise ConfigError(
                f"data.path: row {i}: the model's chat template cannot render it ({type(exc).__name__}: {exc})"
            ) from None
        if example.prompt_length >= max_length:
            raise ConfigError(
                f"data.max_length {max_length} is shorter than the prompt of row {i} ({example.prompt_length} "
                "tokens before its first assistant turn); raise data.max_length"
            )
        examples.append(example)
    return examples


def data_fingerprint(examples: list[Encoded]) -> str:
    """A hash of every id and label: a resumed run must train on exactly the same data."""
    digest = hashlib.blake2b(digest_size=16)
    for example in examples:
        digest.update(repr((example.input_ids, example.labels)).encode())
    return digest.hexdigest()


def describe(
    examples: list[Encoded],
    config: SFTConfig,
    trainable: int,
    total: int,
    device: Any,
    bf16: bool,
    run_dir: Path,
    world: World | None = None,
) -> str:
    """What is about to be trained, in three lines: data, model, run."""
    tokens = sum(len(e.input_ids) for e in examples)
    trained = sum(e.trained for e in examples)
    cut = [e for e in examples if e.cut]
    kind = f"LoRA rank {config.lora.rank}" if config.lora.enabled else "full fine-tuning"
    return (
        f"data: {len(examples)} conversations, {tokens:,} tokens, {trained:,} trained ({trained / tokens:.1%}), "
        f"longest {max(len(e.input_ids) for e in examples)}; {len(cut)} cut at max_length {config.data.max_length}"
        f" ({sum(e.cut for e in cut):,} trained tokens lost)\n"
        f"model: {config.model.path or 'tiny'}, {total / 1e6:.2f}M parameters, {trainable / 1e6:.2f}M trainable "
        f"({kind}); {device.type}, {'bf16 autocast' if bf16 else 'float32'}\n"
        f"run: {run_dir}, {config.train.steps} steps of {config.train.batch_size} conversations"
        + fsdp.processes(world or World(), config.train.fsdp)
    )


def resume_config(run_dir: str | Path, overrides: dict[str, str] | None = None) -> SFTConfig:
    """The config a run was started with (``RUN_DIR/config.toml``), with ``overrides`` on top."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"--resume {run_dir}: no {CONFIG_FILE} there; is it an SFT run folder?")
    return load_config(SFTConfig, path, overrides)
