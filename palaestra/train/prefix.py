"""Shared-prefix training: the context every conversation of a step starts with is computed once.

Both trainers use it: SFT on a step's conversations (``train.share_prefix``), RL on a step's sampled
sequences (``train.share_prefix`` in its config; ``policy_update.py``).

Conversations from one environment start alike: the system prompt and the start of the first
user message are about 250 of a tic-tac-toe game's ~570 tokens. A step runs the model on that
shared prefix once and keeps its graph. Each micro-batch attends to the prefix's keys and values
through a cache, expanded (not copied) to its rows, instead of recomputing them; the gradients that
reach those keys and values add up on leaf copies, and after the last micro-batch they go back
through the prefix's graph in one backward pass. The loss and the gradients are the full
computation's, to float rounding (tested), at the cost of fewer tokens.

The prefix stops before the hidden state that predicts the first trained token, so every position
whose output is trained is computed in the micro-batches.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from palaestra.train.tokenize import Encoded

MIN_PREFIX = 16  # shorter shared prefixes are not worth a separate forward pass


def shared_prefix_length(examples: Sequence[Encoded]) -> int:
    """How many leading tokens all ``examples`` share and none trains on (0 when too few to bother)."""
    return common_prefix_length([e.input_ids for e in examples], [e.prompt_length for e in examples])


def common_prefix_length(rows: Sequence[Sequence[int]], first_trained: Sequence[int]) -> int:
    """How many leading ids all ``rows`` share, stopping before the hidden state that predicts
    any row's first trained token (``first_trained``: its index); 0 when too few to bother."""
    if not rows:
        return 0
    limit = min(first_trained) - 1
    first = rows[0]
    length = 0
    while length < limit and all(row[length] == first[length] for row in rows):
        length += 1
    return length if length >= MIN_PREFIX else 0


class SharedPrefix:
    """The prefix's keys and values, computed once per step, handed to each micro-batch as a cache."""

    def __init__(self, backbone: Any, ids: list[int], device: Any) -> None:
        import torch

        takes = inspect.signature(backbone.forward).parameters
        self.cache_arg = "cache" if "cache" in takes else "past_key_values"  # renamed in transformers 5
        self.config = backbone.config
        out = backbone(input_ids=torch.tensor([ids], device=device), use_cache=True)
        cache = out.cache if self.cache_arg == "cache" else out.past_key_values
        self.states = [(keys, values) for keys, values, *_ in cache]  # with their graph
        self.leaves = [(_leaf(k), _leaf(v)) for k, v in self.states]
        self.length = len(ids)

    def cache_for(self, rows: int) -> dict[str, Any]:
        """The keyword argument that gives a micro-batch of ``rows`` rows the prefix as its cache."""
        from transformers import DynamicCache

        data = [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in self.leaves]
        return {self.cache_arg: DynamicCache(data, config=self.config)}

    def backward(self) -> None:
        """Send the gradients gathered on the keys and values back through the prefix's graph."""
        import torch

        tensors, grads = [], []
        for state, leaf in zip(self.states, self.leaves, strict=True):
            for tensor, copy in zip(state, leaf, strict=True):
                if tensor.requires_grad and copy.grad is not None:
                    tensors.append(tensor)
                    grads.append(copy.grad)
        if tensors:
            torch.autograd.backward(tensors, grads)


def _leaf(tensor: Any) -> Any:
    """A graph-free copy that gathers the gradient meant for ``tensor`` (if ``tensor`` has one at all)."""
    return tensor.detach().requires_grad_(tensor.requires_grad)
