"""Which conversations each step trains on, and how a step is cut into micro-batches.

The order is a pure function of (seed, epoch): every epoch is a fresh seeded shuffle, cut into
steps of ``batch_size`` conversations (the last step of an epoch may hold fewer). Resuming at
step ``k`` therefore needs nothing but ``k``.

A step's conversations are cut into micro-batches of at most ``max_tokens`` tokens (padding
included), which bounds memory. Two layouts:

- **padded** (default): sorted by length, so rows of a micro-batch have similar lengths;
  right-padded, with an attention mask only when there is padding at all.
- **packed**: conversations are packed first-fit-decreasing into rows of at most ``row_tokens``
  tokens, each starting again at position 0. With no attention mask, transformers reads the
  restarts in ``position_ids`` and builds a block-diagonal causal mask, so packed conversations
  never attend to each other (tests check logits against separate forward passes).

The loss of a step is the sum over its trained tokens divided by their count in the whole step,
so how a step is cut into micro-batches changes nothing but memory and speed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from palaestra.train.tokenize import IGNORE, Encoded
from palaestra.types import derive_seed


@dataclass
class MicroBatch:
    """Tensors of one forward/backward pass; ``tokens`` real tokens, ``padding`` pad positions."""

    input_ids: Any
    labels: Any
    position_ids: Any
    attention_mask: Any | None
    tokens: int
    padding: int
    trained: int


def step_indices(num_examples: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The conversation indices of optimizer step ``step`` (counted from 0)."""
    steps_per_epoch = math.ceil(num_examples / batch_size)
    epoch, k = divmod(step, steps_per_epoch)
    order = list(range(num_examples))
    random.Random(derive_seed("palaestra/sft/order", seed, epoch)).shuffle(order)
    return order[k * batch_size : (k + 1) * batch_size]


def micro_batches(
    examples: Sequence[Encoded], *, max_tokens: int, pad_id: int, packing: bool, row_tokens: int
) -> list[MicroBatch]:
    """The step's ``examples`` as micro-batches of at most ``max_tokens`` tokens, padding included."""
    by_length = sorted(examples, key=lambda e: len(e.input_ids), reverse=True)
    rows = _pack(by_length, row_tokens) if packing else [[e] for e in by_length]
    batches, group = [], []
    for row in rows:  # rows come longest first, so the first row of a group sets its width
        width = sum(len(e.input_ids) for e in (group[0] if group else row))
        if group and (len(group) + 1) * width > max_tokens:
            batches.append(_tensors(group, pad_id))
            group = []
        group.append(row)
    if group:
        batches.append(_tensors(group, pad_id))
    return batches


def _pack(examples: Sequence[Encoded], capacity: int) -> list[list[Encoded]]:
    """First-fit-decreasing: each conversation goes into the first row it fits; longest rows first."""
    rows: list[list[Encoded]] = []
    room: list[int] = []
    for example in examples:  # already longest first
        n = len(example.input_ids)
        slot = next((i for i, r in enumerate(room) if r >= n), None)
        if slot is None:
            rows.append([example])
            room.append(capacity - n)
        else:
            rows[slot].append(example)
            room[slot] -= n
    return sorted(rows, key=lambda row: sum(len(e.input_ids) for e in row), reverse=True)


def _tensors(rows: list[list[Encoded]], pad_id: int) -> MicroBatch:
    import torch

    lengths = [sum(len(e.input_ids) for e in row) for row in rows]
    width = max(lengths)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    packed = any(len(row) > 1 for row in rows)
    for r, row in enumerate(rows):
        at = 0
        for example in row:
            n = len(example.input_ids)
            input_ids[r, at : at + n] = torch.tensor(example.input_ids)
            labels[r, at : at + n] = torch.tensor(example.labels)
            position_ids[r, at : at + n] = torch.arange(n)
            at += n
        position_ids[r, at:] = torch.arange(width - at)  # padding: a block of its own, never trained
    attention_mask = None
    if not packed and min(lengths) < width:
        attention_mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    tokens = sum(lengths)
    trained = int((labels != IGNORE).sum())
    return MicroBatch(
        input_ids, labels, position_ids, attention_mask, tokens, len(rows) * width - tokens, trained
    )
