"""The SFT trainer's config: one frozen dataclass per TOML section, each checking its own values.

docs/training.md is the reference of every key; ``examples/tictactoe/*.toml`` are worked configs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LLAMA_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SEED_LIMIT = 2**63  # seeds are in [0, 2**63): torch's and palaestra.types.derive_seed's range
MAX_TINY_PARAMETERS = 1_000_000_000  # a [model.tiny] past this is a typo (and would not fit in memory)


@dataclass(frozen=True)
class DataConfig:
    """The conversations to learn: a dataset folder (``--save-dataset``, ``data filter``) or a JSONL file."""

    path: str
    max_length: int = 1024  # tokens per conversation; longer ones are cut (and counted)

    def __post_init__(self) -> None:
        _at_least("max_length", self.max_length, 2)


@dataclass(frozen=True)
class TinyModelConfig:
    """A randomly initialised Llama with a tokenizer trained on the dataset's own text (a Mistral,
    the same decoder with sliding-window attention, when ``attention_window`` is set)."""

    vocab_size: int = 1000
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 2048
    initializer_range: float = 0.02
    tie_embeddings: bool = True
    seed: int = 0
    split_digits: bool = False  # True: each digit its own token (palaestra.tiny_model.train_tokenizer)
    split_spaces: bool = False  # True: each space its own token, so a word is one token wherever it is
    attention_window: int | None = None  # sliding-window attention over the last N tokens (a Mistral)

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
        ):
            _in_range(name, getattr(self, name), 1, 2**20)
        _in_range("max_positions", self.max_positions, 1, 2**20)
        if self.attention_window is not None:
            _in_range("attention_window", self.attention_window, 1, self.max_positions)
        if not 0 < self.initializer_range <= 1:
            raise ValueError(f"initializer_range must be in (0, 1], got {self.initializer_range}")
        _in_range("seed", self.seed, 0, SEED_LIMIT - 1)
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("hidden_size must divide by num_heads, and num_heads by num_kv_heads")
        if self.parameters() > MAX_TINY_PARAMETERS:
            raise ValueError(
                f"these sizes make {self.parameters():,} parameters, more than a tiny model's "
                f"{MAX_TINY_PARAMETERS:,}; for a large model give model.path"
            )

    def parameters(self) -> int:
        """The parameter count of a Llama of these sizes (embeddings, attention, MLP, norms)."""
        hidden, kv = self.hidden_size, self.hidden_size // self.num_heads * self.num_kv_heads
        layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * self.intermediate_size + 2 * hidden
        embeddings = self.vocab_size * hidden * (1 if self.tie_embeddings else 2)
        return embeddings + self.num_layers * layer + hidden


@dataclass(frozen=True)
class ModelConfig:
    """``path``: a model folder, a hub id or ``smollm2``; or a ``[model.tiny]`` table instead."""

    path: str | None = None
    tiny: TinyModelConfig | None = None
    attn_implementation: str = "sdpa"

    def __post_init__(self) -> None:
        if (self.path is None) == (self.tiny is None):
            raise ValueError(
                "give exactly one of path (a model folder, a hub id or smollm2) and [model.tiny]"
            )


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters instead of full fine-tuning; merged into every checkpoint."""

    enabled: bool = False
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = LLAMA_LINEAR

    def __post_init__(self) -> None:
        _in_range("rank", self.rank, 1, 4096)
        _in_range("alpha", self.alpha, 1, 2**16)
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("target_modules must name at least one module")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW, linear warm-up, then a constant or cosine learning rate; gradient clipping."""

    lr: float = 5e-5
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # the cosine schedule ends at lr × min_lr_ratio
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # 0 turns clipping off (the norm is still logged)

    def __post_init__(self) -> None:
        if not 0 <= self.lr <= 1:  # AdamW moves each weight by about lr a step: past 1 it only diverges
            raise ValueError(f"lr must be in [0, 1], got {self.lr}")
        _at_least("warmup_steps", self.warmup_steps, 0)
        if not 0 <= self.min_lr_ratio <= 1 or not 0 <= self.weight_decay <= 1 or self.max_grad_norm < 0:
            raise ValueError(
                "need 0 <= min_lr_ratio <= 1, 0 <= weight_decay <= 1 and max_grad_norm >= 0, got "
                f"{self.min_lr_ratio}, {self.weight_decay}, {self.max_grad_norm}"
            )
        if not all(0 <= b < 1 for b in self.betas) or not 0 < self.eps <= 1:
            raise ValueError(f"betas must be in [0, 1) and eps in (0, 1], got {self.betas}, {self.eps}")


@dataclass(frozen=True)
class TrainConfig:
    """How long and in what pieces: steps of ``batch_size`` conversations, cut into micro-batches."""

    steps: int = 100
    batch_size: int = 8  # conversations per optimizer step
    micro_batch_tokens: int = 4096  # tokens (padding included) per forward/backward pass
    share_prefix: bool = True  # compute the context all of a step's conversations share once
    seed: int = 0
    device: str = "auto"  # "auto": CUDA when present, else CPU
    mixed_precision: Literal["auto", "bf16", "no"] = "auto"  # auto: bf16 autocast on a GPU that has it
    gradient_checkpointing: bool = False  # recompute activations in the backward: memory for compute
    fsdp: bool | Literal["layers"] = False  # shard the optimizer state (FSDP2); "layers": the weights
    threads: int = 0  # torch CPU threads; 0 keeps torch's default

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "micro_batch_tokens"):
            _at_least(name, getattr(self, name), 1)
        if self.gradient_checkpointing and self.share_prefix:
            raise ValueError(
                "gradient_checkpointing needs share_prefix = false: the shared prefix's cached states "
                "are not recomputed in the backward pass"
            )
        _at_least("threads", self.threads, 0)
        _in_range("seed", self.seed, 0, SEED_LIMIT - 1)


@dataclass(frozen=True)
class OutputConfig:
    """Where the run goes, how often it is saved and logged."""

    dir: str = "outputs/sft"
    save_every: int = 0  # steps between checkpoints; 0: only at the end
    log_every: int = 1  # steps between plain progress lines (metrics.jsonl gets every step)
    tracking: tuple[Literal["tensorboard", "wandb"], ...] = ()  # also log there (palaestra.train.tracking)
    wandb_project: str = "palaestra"
    wandb_mode: Literal["offline", "online"] = "offline"  # offline: files only, `wandb sync` uploads them

    def __post_init__(self) -> None:
        from palaestra.train.tracking import missing_tracker_package

        _at_least("save_every", self.save_every, 0)
        _at_least("log_every", self.log_every, 1)
        if len(set(self.tracking)) < len(self.tracking):
            raise ValueError(f"tracking names a tracker twice: {list(self.tracking)}")
        for name in self.tracking:
            reason = missing_tracker_package(name)
            if reason:
                raise ValueError(reason)


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning on the assistant turns of chat conversations."""

    data: DataConfig
    model: ModelConfig
    lora: LoraConfig = field(default_factory=LoraConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        check_fsdp(self.train.fsdp, self.lora.enabled, self.train.share_prefix)
        if self.train.micro_batch_tokens < self.data.max_length:
            raise ValueError(
                f"train.micro_batch_tokens ({self.train.micro_batch_tokens}) must be at least data.max_length "
                f"({self.data.max_length}): the longest conversation must fit in one micro-batch"
            )
        tiny = self.model.tiny
        if tiny is not None and tiny.max_positions < self.data.max_length:
            raise ValueError(
                f"model.tiny.max_positions ({tiny.max_positions}) must be at least data.max_length "
                f"({self.data.max_length}): no conversation may be longer than the model's positions"
            )


def check_fsdp(fsdp: bool | str, lora: bool, share_prefix: bool) -> None:
    """``train.fsdp`` shards full fine-tuning: LoRA's optimizer state is the adapter's, small already;
    its layer mode runs no shared prefix (its late backward would reach layers already resharded)."""
    if fsdp == "layers" and share_prefix:
        raise ValueError(
            'train.fsdp = "layers" needs train.share_prefix = false: the shared prefix\'s keys and values '
            "are backpropagated after the layers they came from were resharded"
        )
    if fsdp and lora:
        raise ValueError(
            "train.fsdp with lora.enabled is not supported: LoRA's optimizer state is the adapter's, "
            "which FSDP would barely shrink; set train.fsdp = false (or lora.enabled = false)"
        )


def _at_least(name: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


def _in_range(name: str, value: int, low: int, high: int) -> None:
    """``ValueError`` naming ``name`` unless ``low <= value <= high``."""
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high:,}, got {value:,}")
