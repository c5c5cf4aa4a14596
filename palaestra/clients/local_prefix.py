"""The prefix cache of LocalClient: KV states of earlier prompts and replies, reused by later requests.

A multi-turn rollout sends the whole conversation every turn, so each prompt's token ids extend
the previous turn's prompt + reply; the rollouts of a group share their whole first prompt. An
entry keeps the KV states of one token sequence (a (key, value) pair of [heads, tokens, head_dim]
tensors per layer) and, at the lengths where a prompt ended, the float32 next-token logits there.
A request reuses the longest token-id prefix it shares with any entry and prefills only the rest;
a prompt equal to a cached one with logits needs no forward pass at all, and gets bit-identical
first logits (so a repeated request is exactly reproducible, as it was without the cache).

An entry that is a prefix of a newer one is dropped (the newer one holds the same states).
Entries are evicted least recently used first to stay within ``budget`` bytes; an evicted prefix
is simply computed again. Memory: per token, 2 × layers × kv_heads × head_dim × dtype bytes
(SmolLM2-135M in float32: 45 KiB).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

KV = list[tuple["torch.Tensor", "torch.Tensor"]]  # per layer: (keys, values), [heads, tokens, head_dim]


@dataclass(eq=False)
class Entry:
    """The KV states of ``ids``, and next-token logits at some of its lengths."""

    ids: np.ndarray
    kv: KV
    logits: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        tensors = [t for pair in self.kv for t in pair] + list(self.logits.values())
        return sum(t.numel() * t.element_size() for t in tensors)


class PrefixCache:
    """An LRU of ``Entry`` objects within ``budget`` bytes, matched by longest token-id prefix."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"the prefix cache budget must be at least 0 bytes, got {budget}")
        self.budget = budget
        self.nbytes = 0
        self.evictions = 0  # entries dropped to stay within the budget
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # id(entry) -> entry, oldest first

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, ids: Sequence[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with ``ids``, and that prefix's length.

        Among entries matching all of ``ids``, one with logits at ``len(ids)`` wins. The winner
        becomes the most recently used.
        """
        query = np.asarray(ids, dtype=np.int64)
        best, best_len, best_full = None, 0, False
        for entry in self._entries.values():
            n = min(len(entry.ids), len(query))
            if n < best_len or (n == best_len and best_full) or not n or entry.ids[0] != query[0]:
                continue
            same = entry.ids[:n] == query[:n]
            length = n if same.all() else int(same.argmin())
            full = length == len(query) and length in entry.logits
            if length > best_len or (length == best_len and full):
                best, best_len, best_full = entry, length, full
        if best is not None:
            self._entries.move_to_end(id(best))
        return best, best_len

    def add(self, ids: Sequence[int], kv: KV, logits: dict[int, torch.Tensor] | None = None) -> None:
        """Keep the states ``kv`` of ``ids`` (and ``logits`` by prefix length) as the newest entry.

        Entries that are prefixes of ``ids`` are dropped and their logits carried over; if
        ``ids`` is itself a prefix of an entry, that entry takes the logits instead. Room is made
        before anything is added, so the cache never holds more than ``budget`` bytes.
        """
        new = Entry(np.asarray(ids, dtype=np.int64), kv, dict(logits or {}))
        if not len(new.ids) or new.nbytes > self.budget:
            return
        for key, entry in list(self._entries.items()):
            n = min(len(entry.ids), len(new.ids))
            if not np.array_equal(entry.ids[:n], new.ids[:n]):
                continue
            if len(entry.ids) <= len(new.ids):  # the new entry holds these states too
                new.logits = {**entry.logits, **new.logits}
                self._drop(key)
            else:  # an older entry already holds every state of the new one
                extra = {k: v for k, v in new.logits.items() if k not in entry.logits}
                size = sum(t.numel() * t.element_size() for t in extra.values())
                self._entries.move_to_end(key)
                if self._make_room(size, keep=key):
                    entry.logits.update(extra)
                    self.nbytes += size
                return
        if self._make_room(new.nbytes):
            self._entries[id(new)] = new
            self.nbytes += new.nbytes

    def clear(self) -> None:
        """Drop every entry (the model's weights changed: every state is stale)."""
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes

    def _make_room(self, size: int, keep: int | None = None) -> bool:
        """Evict least recently used entries (never ``keep``) until ``size`` more bytes fit."""
        for key in list(self._entries):
            if self.nbytes + size <= self.budget:
                break
            if key != keep:
                self._drop(key)
                self.evictions += 1
        return self.nbytes + size <= self.budget
