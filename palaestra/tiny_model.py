"""Tiny causal LMs built from a config, with a tokenizer trained on the text they will see.

Tests, benchmarks and the tic-tac-toe recipe need real transformers models that download nothing
and run fast on a CPU. ``build_tiny_model`` trains a byte-level BPE tokenizer on the given texts,
gives it a ChatML chat template (the same format as SmolLM2's), and builds a randomly initialised
Llama of the requested size. Needs the ``local`` extra (torch, transformers, tokenizers).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHATML_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{%- for c in m['tool_calls'] or [] %}"  # Hermes-style calls, as LocalClient parses them back
    '<tool_call>{"name": {{ c.function.name | tojson }}, "arguments": {{ c.function.arguments | tojson }}}'
    "</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<|pad|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class TinyConfig:
    """The size of a tiny Llama. The defaults make ~60k parameters: a model for tests."""

    vocab_size: int = 400
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 256
    initializer_range: float = 0.2  # peaked output distributions, like a trained model's
    tie_embeddings: bool = False
    seed: int = 0
    split_digits: bool = False  # True: every digit its own token, wherever it stands (see train_tokenizer)
    split_spaces: bool = False  # True: a space is a token of its own, never part of a word's
    attention_window: int | None = None  # each token sees only the last N (a Mistral); None: all (a Llama)


def train_tokenizer(
    texts: Iterable[str], *, vocab_size: int = 400, split_digits: bool = False, split_spaces: bool = False
) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts``, with the ChatML template.

    EOS is ``<|im_end|>`` (the end of every chat turn) and the pad token is ``<|pad|>``. With
    ``split_digits`` each digit is a token of its own, never merged with a space or another digit
    (as Llama's and SmolLM2's tokenizers do): ``"cell 7"``, ``"| 7 |"`` and ``"<move>7"`` then share
    the token ``7``, so a small model can copy a number from the board to its move. Without it,
    byte-level BPE makes ``" 7"`` and ``"7"`` two unrelated tokens. ``split_spaces`` does the same
    for words: a space is a token of its own, so ``"Ada"`` in ``I am Ada`` and in ``{"name": "Ada"}``
    is one token, which a small model can copy from a question into a tool call.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    steps: list[Any] = []
    if split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if split_spaces:
        steps.append(pre_tokenizers.Split(" ", behavior="isolated"))
    bpe.pre_tokenizer = pre_tokenizers.Sequence([*steps, byte_level]) if steps else byte_level
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|pad|>")
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(
    texts: Iterable[str], config: TinyConfig = TinyConfig(), *, path: str | os.PathLike[str] | None = None
) -> tuple[Any, Any]:
    """A randomly initialised Llama of ``config``'s size and a tokenizer trained on ``texts``.

    With ``config.attention_window`` it is a Mistral instead, the same decoder whose attention is
    limited to the last ``attention_window`` tokens (sliding-window attention): for a task whose
    last message holds everything a reply needs, such as a game that shows the board every turn, a
    small model then never has to learn to look past the long history. Deterministic for the same
    texts and config. With ``path`` both are also saved there as a model directory that
    ``LocalClient`` and ``from_pretrained`` load.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    if config.attention_window is not None and config.attention_window < 1:
        raise ValueError(
            f"attention_window must be a positive number of tokens, got {config.attention_window}"
        )
    tokenizer = train_tokenizer(
        texts,
        vocab_size=config.vocab_size,
        split_digits=config.split_digits,
        split_spaces=config.split_spaces,
    )
    kind: Any = LlamaConfig
    model_class: Any = LlamaForCausalLM
    window: dict[str, Any] = {}
    if config.attention_window is not None:  # the same decoder with sliding-window attention
        kind, model_class = MistralConfig, MistralForCausalLM
        window = {"sliding_window": config.attention_window}
    architecture = kind(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        vocab_size=len(tokenizer),
        max_position_embeddings=config.max_positions,
        initializer_range=config.initializer_range,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=config.tie_embeddings,
        head_dim=config.hidden_size // config.num_heads,
        **window,
    )
    with torch.random.fork_rng(devices=[]):  # the global RNG of the caller is left as it was
        torch.manual_seed(config.seed)
        model = model_class(architecture)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if path is not None:
        Path(path).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return model, tokenizer
