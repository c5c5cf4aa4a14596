"""Which conversations each step trains on, and how a step is cut into micro-batches.

The order is a pure function of (seed, epoch): every epoch is a fresh seeded shuffle, cut into
steps of ``batch_size`` conversations (the last step of an epoch may hold fewer). Resuming at
step ``k`` therefore needs nothing but ``k``.

A step's conversations are sorted by length and cut into micro-batches of at most ``max_tokens``
tokens, padding included, which bounds memory. Rows are right-padded with no attention mask: under
causal attention no real token sees the padding after it, and without a mask attention takes its
fast causal path. Sorting keeps the padding small (rows of a micro-batch have similar lengths).
Packing several conversations into one row was measured slower on CPU (docs/training.md): without a
variable-length attention kernel a packed row needs a dense block-diagonal mask over the whole row.

``start`` drops the first ``start`` tokens of every row: the step's shared prefix, computed once
(``prefix.py``); the rows' positions then begin at ``start``. The loss of a step is the sum over
its trained tokens divided by their count in the whole step, so how a step is cut into
micro-batches changes nothing but memory and speed.
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
    tokens: int
    padding: int

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])


def step_indices(num_examples: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The conversation indices of optimizer step ``step`` (counted from 0)."""
    steps_per_epoch = math.ceil(num_examples / batch_size)
    epoch, k = divmod(step, steps_per_epoch)
    order = list(range(num_examples))
    random.Random(derive_seed("palaestra/sft/order", seed, epoch)).shuffle(order)
    return order[k * batch_size : (k + 1) * batch_size]


def micro_batches(
    examples: Sequence[Encoded], *, max_tokens: int, pad_id: int, start: int = 0
) -> list[MicroBatch]:
    """The step's ``examples`` (from token ``start`` on) in micro-batches of at most ``max_tokens``."""
    by_length = sorted(examples, key=lambda e: len(e.input_ids), reverse=True)
    batches: list[MicroBatch] = []
    group: list[Encoded] = []
    for example in by_length:  # longest first, so the first row of a group sets its width
        width = len((group[0] if group else example).input_ids) - start
        if group and (len(group) + 1) * width > max_tokens:
            batches.append(_tensors(group, pad_id, start))
            group = []
        group.append(example)
    if group:
        batches.append(_tensors(group, pad_id, start))
    return batches


def _tensors(rows: list[Encoded], pad_id: int, start: int) -> MicroBatch:
    import torch

    lengths = [len(e.input_ids) - start for e in rows]
    width = max(lengths)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for r, example in enumerate(rows):
        input_ids[r, : lengths[r]] = torch.tensor(example.input_ids[start:])
        labels[r, : lengths[r]] = torch.tensor(example.labels[start:])
    # positions run on through the padding: no restart, which transformers would read as packing
    position_ids = torch.arange(start, start + width).expand(len(rows), -1)
    tokens = sum(lengths)
    return MicroBatch(input_ids, labels, position_ids, tokens, len(rows) * width - tokens)
