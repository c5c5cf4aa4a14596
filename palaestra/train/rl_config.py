"""The RL trainer's config: the SFT config's model, LoRA, optimizer and output sections, plus the
environment, the sampling, the loss, the batch and the held-out evaluations.

docs/rl.md is the reference of every key (the shared sections: docs/training.md);
``examples/tictactoe/*rl*.toml`` are worked configs.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from palaestra.train.losses import LOSSES
from palaestra.train.mismatch import MisLevel, MismatchConfig
from palaestra.train.sft_config import (
    SEED_LIMIT,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    OutputConfig,
    check_fsdp,
)
from palaestra.types import Sampling

MAX_TEMPERATURE = 100  # past this every token is equally likely: nothing the policy learnt shows
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # an eval set's name is a folder name

LossName = Literal["grpo", "dr_grpo", "dapo", "cispo", "masked_is"]
assert set(LossName.__args__) == set(LOSSES)  # type: ignore[attr-defined]  # a Literal's values


@dataclass(frozen=True)
class EnvConfig:
    """The environment to train on: a name ``palaestra envs`` lists, and its ``load_environment`` arguments."""

    id: str = "tictactoe"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SamplingConfig:
    """How the policy samples: exploration is the temperature's job (the talk: 1.0, then 1.25; 1.4 collapsed)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128  # per reply

    def __post_init__(self) -> None:
        if not 0 < self.temperature < MAX_TEMPERATURE or not 0 < self.top_p <= 1 or self.max_tokens < 1:
            raise ValueError(
                f"need 0 < temperature < {MAX_TEMPERATURE} (greedy rollouts of one example are all alike: "
                "nothing to compare), 0 < top_p <= 1 and max_tokens >= 1"
            )
        self.as_sampling()  # and the limits every model request has (max_tokens < 2**31)

    def as_sampling(self) -> Sampling:
        """The sampling of every rollout: these values, with the sampler's logprobs."""
        return Sampling(
            temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens, logprobs=True
        )


@dataclass(frozen=True)
class LossConfigSection:
    """The policy-gradient loss (see palaestra/train/losses.py for each formula and its paper)."""

    name: LossName = "cispo"
    eps_low: float = 0.2  # grpo, dr_grpo, dapo: the lower clip of the ratio
    eps_high: float = 0.28  # dapo: the upper clip; cispo: the importance weight's cap is 1 + eps_high
    mask_low: float = 0.125  # masked_is: tokens whose ratio to the sampler leaves [mask_low, mask_high]
    mask_high: float = 8.0
    kl_beta: float = 0.0  # KL to the starting model; 0 loads no reference model
    advantage_scale: Literal["none", "group_std", "batch_std"] = "none"
    tis_cap: float = 0.0  # > 0: truncated importance weights min(rho, tis_cap) for the sampler mismatch
    mis: MisLevel = "none"  # "token", "sequence": mask where rho leaves [mis_low, mis_high]
    mis_low: float = 0.5
    mis_high: float = 2.0

    def __post_init__(self) -> None:
        if (
            not 0 <= self.eps_low < 1
            or self.eps_high < 0
            or not 0 < self.mask_low < 1 < self.mask_high
            or self.kl_beta < 0
        ):
            raise ValueError(
                "need 0 <= eps_low < 1 (the ratio's lower clip is 1 - eps_low), eps_high >= 0, "
                "kl_beta >= 0 and 0 < mask_low < 1 < mask_high"
            )
        if not (self.tis_cap == 0 or self.tis_cap >= 1) or not 0 < self.mis_low < 1 < self.mis_high:
            raise ValueError(
                f"need tis_cap 0 (off) or at least 1 (a cap below 1 would shrink every on-policy token), "
                f"and 0 < mis_low < 1 < mis_high; got {self.tis_cap}, {self.mis_low}, {self.mis_high}"
            )

    def mismatch(self) -> MismatchConfig:
        """The sampler-mismatch corrections these values ask for (``palaestra/train/mismatch.py``)."""
        return MismatchConfig(
            tis_cap=self.tis_cap, mis=self.mis, mis_low=self.mis_low, mis_high=self.mis_high
        )


@dataclass(frozen=True)
class RLTrainConfig:
    """How long and in what pieces. ``batch_size`` counts rollouts: examples × ``rollouts_per_example``."""

    steps: int = 100
    batch_size: int = 64
    rollouts_per_example: int = 8
    update_passes: int = 1  # optimizer steps on each batch; ratios stay taken against the sampler
    max_off_policy_steps: int = 0  # k: the next k steps' rollouts are sampled while this one trains
    micro_batch_tokens: int = 8192  # tokens (padding included) per forward/backward pass
    max_length: int = 0  # tokens per training sequence; longer ones are cut (and counted); 0: no limit
    max_concurrent: int = 64  # model requests in flight while sampling
    seed: int = 0
    device: str = "auto"
    mixed_precision: Literal["auto", "bf16", "no"] = "auto"
    gradient_checkpointing: bool = False  # recompute activations in the backward: memory for compute
    fsdp: bool | Literal["layers"] = False  # shard the optimizer state (FSDP2); "layers": the weights
    share_prefix: bool = True  # run the start all of a step's sequences share (the system prompt) once
    threads: int = 0

    def __post_init__(self) -> None:
        for name in (
            "steps",
            "batch_size",
            "rollouts_per_example",
            "update_passes",
            "micro_batch_tokens",
            "max_concurrent",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.gradient_checkpointing and self.share_prefix:
            raise ValueError(
                "gradient_checkpointing needs share_prefix = false: the shared prefix's cached states "
                "are not recomputed in the backward pass"
            )
        if not 0 <= self.max_off_policy_steps <= 1000:
            raise ValueError(
                f"max_off_policy_steps must be between 0 and 1000, got {self.max_off_policy_steps}"
            )
        if self.rollouts_per_example < 2:
            raise ValueError(
                f"rollouts_per_example must be at least 2, got {self.rollouts_per_example}: a rollout's "
                "advantage is its reward against the others of its group"
            )
        if not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed must be between 0 and 2**63 - 1, got {self.seed}")
        if self.max_length < 0:
            raise ValueError(f"max_length must be at least 0 (0: no limit), got {self.max_length}")
        if self.max_length > self.micro_batch_tokens:
            raise ValueError(
                f"micro_batch_tokens ({self.micro_batch_tokens}) must be at least max_length ({self.max_length})"
            )
        if self.batch_size % self.rollouts_per_example:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of rollouts_per_example "
                f"({self.rollouts_per_example}): a batch is whole groups"
            )


@dataclass(frozen=True)
class EvalSet:
    """One held-out evaluation: a name for the log and the environment's arguments (all of them:
    they are not merged with the training ones; give the held-out games a seed of their own)."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not FOLDER_NAME.fullmatch(self.name):
            raise ValueError(
                f"an eval set's name is a folder name under RUN_DIR/evals/ (letters, digits, '.', '_', '-'), "
                f"got {self.name!r}"
            )


@dataclass(frozen=True)
class EvalConfig:
    """Held-out games every ``every`` steps (and at the start and the end): one rollout per example."""

    every: int = 0  # 0: only before the first step and after the last
    num_examples: int = 100
    temperature: float = 1.0
    sets: tuple[EvalSet, ...] = ()

    def __post_init__(self) -> None:
        if self.every < 0 or self.num_examples < 1 or not 0 <= self.temperature < MAX_TEMPERATURE:
            raise ValueError(
                f"need every >= 0, num_examples >= 1 and 0 <= temperature < {MAX_TEMPERATURE}, got "
                f"{self.every}, {self.num_examples}, {self.temperature}"
            )
        names = [s.name for s in self.sets]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two eval sets are named {twice[0]!r}: each is saved under its name")


@dataclass(frozen=True)
class RLOutputConfig(OutputConfig):
    """The SFT output section, plus rollouts saved as runs ``palaestra report`` opens."""

    dir: str = "outputs/rl"
    sample_every: int = 10  # steps between saved samples of the batch's rollouts; 0: never
    sample_groups: int = 8  # groups per saved sample

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sample_every < 0 or self.sample_groups < 1:
            raise ValueError("need sample_every >= 0 and sample_groups >= 1")


SyncName = Literal["auto", "lora", "reload"]


@dataclass(frozen=True)
class SamplerConfig:
    """Where rollouts are sampled: in this process (``local``), or by a server that speaks vLLM's
    OpenAI API and weight-sync endpoints (``vllm``: vLLM itself, or ``palaestra serve``).

    ``command`` (optional) starts that server; palaestra waits for it (``startup_timeout`` seconds)
    and stops it at the end. ``{weights_dir}`` in it is replaced by the folder the starting
    weights are written to (``weights_dir``; default ``RUN_DIR/sampler``), which it should serve.
    ``sync``: how new weights reach it; ``auto`` is ``lora`` with ``[lora]`` enabled (an adapter
    per version), else ``reload`` (the weights written to ``weights_dir``, then reloaded).

    ``executor``: where the rollouts run: this process (``local``), or Ray workers that reach the
    server at ``url`` (``ray``: a new local cluster; ``ray=ADDRESS``: ``auto``, ``HOST:PORT`` or
    ``ray://HOST:PORT``, a running one), ``workers`` of them (0: one per CPU of the cluster), as
    ``palaestra eval --executor ray[=ADDRESS] --workers N`` runs them."""

    kind: Literal["local", "vllm"] = "local"
    url: str = ""  # vllm: the server's base URL, http://HOST:PORT/v1
    command: str = ""  # vllm: a command (no shell) that starts the server at url
    startup_timeout: float = 600.0  # seconds the command's server has to answer
    sync: SyncName = "auto"
    weights_dir: str = ""  # the folder the server serves and reloads; "": RUN_DIR/sampler
    model: str = ""  # the served model's name; "": the first one its /v1/models lists
    timeout: float = 600.0  # seconds per request
    executor: str = "local"  # local | ray | ray=ADDRESS
    workers: int = 0  # ray: rollout workers; 0: one per CPU of the cluster

    def __post_init__(self) -> None:
        from palaestra.clients.openai import ClientConfigError, check_base_url

        kind, eq, address = self.executor.partition("=")
        if (kind, eq) != ("local", "") and (kind != "ray" or (eq and not address)):
            raise ValueError(f"executor {self.executor!r}: expected local, ray or ray=ADDRESS")
        if self.workers < 0 or (self.workers and kind != "ray"):
            raise ValueError(
                f"workers ({self.workers}) is for executor ray: at least 1, or 0 for one per CPU"
            )
        if self.kind == "local":
            if kind == "ray":
                raise ValueError(
                    'executor ray needs a remote sampler (kind = "vllm"): the Ray workers reach the '
                    "server by its url; the local sampler samples in the training process"
                )
            given = [n for n in ("url", "command", "weights_dir", "model") if getattr(self, n)]
            if given or self.sync != "auto":
                raise ValueError(f'{(given or ["sync"])[0]} is for kind = "vllm" (a server); kind is "local"')
            return
        if not self.url:
            raise ValueError('kind = "vllm" needs url, the server\'s base URL (http://HOST:PORT/v1)')
        try:
            check_base_url(self.url)
        except ClientConfigError as exc:
            raise ValueError(f"url: {exc}") from None
        try:
            shlex.split(self.command)
        except ValueError as exc:
            raise ValueError(f"command: {exc}") from None
        if not 0 < self.startup_timeout <= 86400 or not 0 < self.timeout <= 86400:
            raise ValueError("startup_timeout and timeout must be between 0 and 86400 seconds")

    @property
    def ray_address(self) -> str | None:
        """``executor = "ray=ADDRESS"``: the address; ``"ray"``: None (a new local cluster)."""
        return self.executor.partition("=")[2] or None

    def sync_for(self, lora: bool) -> Literal["lora", "reload"]:
        """The weight sync of a run with (``lora``) or without LoRA."""
        if self.sync == "auto":
            return "lora" if lora else "reload"
        return self.sync


@dataclass(frozen=True)
class RLConfig:
    """Reinforcement learning on an environment's rewards, from a model (usually an SFT checkpoint)."""

    model: ModelConfig
    env: EnvConfig = field(default_factory=EnvConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    loss: LossConfigSection = field(default_factory=LossConfigSection)
    lora: LoraConfig = field(default_factory=LoraConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    train: RLTrainConfig = field(default_factory=RLTrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: RLOutputConfig = field(default_factory=RLOutputConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)

    def __post_init__(self) -> None:
        check_fsdp(self.train.fsdp, self.lora.enabled, self.train.share_prefix)
        if self.train.max_off_policy_steps and self.sampler.kind == "local":
            raise ValueError(
                "train.max_off_policy_steps > 0 needs a sampler with weights of its own (sampler.kind = "
                '"vllm"): the local sampler samples the very module being trained'
            )
        if self.sampler.sync == "lora" and not self.lora.enabled:
            raise ValueError('sampler.sync = "lora" needs [lora] enabled: there is no adapter to load')
        sampler = self.sampler
        if sampler.kind == "vllm" and not sampler.command and not sampler.weights_dir:
            if sampler.sync_for(self.lora.enabled) == "reload":
                raise ValueError(
                    "sampler.weights_dir: a server palaestra does not start (no sampler.command) reloads the "
                    "weights from the folder it serves; give that folder (palaestra overwrites its weights)"
                )
        if sampler.weights_dir and self.model.path and _same_folder(sampler.weights_dir, self.model.path):
            raise ValueError(
                f"sampler.weights_dir {sampler.weights_dir} is model.path: palaestra would overwrite the "
                "model it starts from; serve a copy of it"
            )


def _same_folder(a: str, b: str) -> bool:
    import os

    return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))
