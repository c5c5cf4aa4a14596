"""The model to train: load it (a folder, ``smollm2``, or a tiny one built here), add LoRA, save it.

Every checkpoint is a plain transformers folder (weights, config, tokenizer with its chat
template) that ``LocalClient``, ``palaestra eval -m PATH`` and ``palaestra play -m PATH`` load
as they are: LoRA adapters are merged into the saved weights (the adapter is also kept, under
``adapter/``, for resuming and for anyone who wants it alone).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from palaestra.train.sft_config import LoraConfig, ModelConfig

ADAPTER_DIR = "adapter"


def load_model(config: ModelConfig, texts: Callable[[], list[str]], *, device: Any) -> tuple[Any, Any]:
    """The model (float32, on ``device``) and its tokenizer; ``texts`` trains a tiny model's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from palaestra.clients.default_model import chat_template_for, resolve_model

    if config.tiny is not None:
        from palaestra.tiny_model import TinyConfig, build_tiny_model

        sizes = TinyConfig(**dataclasses.asdict(config.tiny))  # the same fields, the training defaults
        model, tokenizer = build_tiny_model(texts(), sizes)
        model.set_attn_implementation(config.attn_implementation)
    else:
        path = resolve_model(str(config.path))
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32, attn_implementation=config.attn_implementation
            )
        except OSError as exc:
            raise ValueError(f"model.path: cannot load {config.path!r} ({exc})") from None
        template = chat_template_for(str(config.path))  # the default model's, with tools
        if template is not None:
            tokenizer.chat_template = template
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"model: the tokenizer of {config.path or 'the tiny model'} has no chat template")
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(model.config, name, None) not in (None, 1.0):
            raise ValueError(f"model: {name} is not supported (the loss applies the output layer alone)")
    return model.to(device), tokenizer


def check_lora_targets(model: Any, config: LoraConfig) -> None:
    """Every name in ``config.target_modules`` must be a linear module of ``model``; peft must be there."""
    import importlib.util

    import torch

    if importlib.util.find_spec("peft") is None:
        raise ValueError("lora needs the peft package: pip install 'palaestra[train]'")

    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    missing = [t for t in config.target_modules if t not in linear]
    if missing:
        raise ValueError(
            f"lora.target_modules: {', '.join(missing)} not in the model; "
            f"its linear modules are: {', '.join(sorted(linear))}"
        )


def add_lora(model: Any, config: LoraConfig) -> Any:
    """``model`` wrapped with fresh LoRA adapters on ``config.target_modules``."""
    check_lora_targets(model, config)
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_config = PeftLoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_config)


def load_adapter(model: Any, path: Path) -> Any:
    """``model`` with the trainable LoRA adapter saved at ``path`` (for resuming)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(path), is_trainable=True)


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


def enable_gradient_checkpointing(model: Any) -> None:
    """Recompute each layer's activations in the backward pass instead of keeping them: memory for
    about a third more compute, what lets long sequences or a large model fit on one GPU. With
    LoRA the inputs are made to require grad, else the frozen embeddings would cut the graph."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if is_lora(model):
        model.enable_input_require_grads()


def backbone_and_head(model: Any) -> tuple[Any, Any]:
    """The transformer body (ids → hidden states) and the output layer of a causal LM (LoRA or not)."""
    base = model.get_base_model() if is_lora(model) else model
    return base.get_decoder(), base.get_output_embeddings()


def save_model(model: Any, tokenizer: Any, path: Path, weights: dict[str, Any] | None = None) -> None:
    """A plain checkpoint at ``path``; a LoRA model is merged into a copy (the live model is untouched).
    ``weights``: the whole model's state dict, when the live model holds only shards of it (FSDP)."""
    if is_lora(model):
        model.save_pretrained(str(path / ADAPTER_DIR))
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(str(path), **({"state_dict": weights} if weights is not None else {}))
    tokenizer.save_pretrained(str(path))


def parameter_counts(model: Any) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
