"""The running batch of LocalClient: one row of KV states per request, joined and left at any step.

Rows are right-aligned in preallocated per-layer buffers [rows, kv_heads, columns, head_dim]:
row ``i`` holds its tokens in columns ``[starts[i], hi)`` and every decoding step writes each
row's new key and value at column ``hi``, so all rows' current tokens share a column and
transformers builds the attention mask (causal, padding, sliding window) from a plain 2-D
padding mask, as for a left-padded batch. Unlike transformers' ``DynamicCache``, which
concatenates (copies) the whole cache at every step, a step writes one column; the buffers are
reallocated, with slack on both sides, only when they run out of room. A request joins by copying
its prefilled states into a free row ending at ``hi`` (a longer one widens the used columns to the
left); one leaves by moving the last row into its place. Buffers start zeroed, and masked columns
only ever hold finite values, so padding never turns into NaN inside attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

if TYPE_CHECKING:
    from palaestra.clients.local_prefix import KV

SLACK = 64  # spare columns on each side when the buffers are reallocated (plus an eighth of those used)


class _RowLayer(DynamicLayer):
    """One layer's view of the batch for transformers: writes the new column, returns the used ones."""

    def __init__(self, batch: RowBatch, index: int) -> None:
        super().__init__()
        self.batch, self.index = batch, index
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, n = self.batch, key_states.shape[-2]
        keys, values = b.keys[self.index], b.values[self.index]
        keys[: b.rows, :, b.hi : b.hi + n] = key_states
        values[: b.rows, :, b.hi : b.hi + n] = value_states
        return keys[: b.rows, :, b.lo : b.hi + n], values[: b.rows, :, b.lo : b.hi + n]

    def get_seq_length(self) -> int:
        return self.batch.hi - self.batch.lo


class RowBatch:
    """The KV buffers, the row geometry and the request of each row of the running batch."""

    def __init__(self, device: torch.device, dtype: torch.dtype, max_rows: int) -> None:
        self.device, self.dtype, self.max_rows = device, dtype, max_rows
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.requests: list[Any] = []  # the request of each row, in row order
        self.starts: list[int] = []  # the first column of each row
        self.lo = self.hi = 0  # the columns in use: [lo, hi)
        self.cache: Cache | None = None

    @property
    def rows(self) -> int:
        return len(self.requests)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def add(self, request: Any, kv: KV) -> None:
        """Append ``request``'s row with states ``kv`` ([heads, tokens, head_dim] per layer)."""
        length = kv[0][0].shape[-2]
        if not self.keys:
            self._allocate(kv, rows=min(8, self.max_rows), hi=length + SLACK, columns=length + 2 * SLACK)
        elif self.rows == self.keys[0].shape[0] or self.hi < length:
            self._reallocate(rows=self.rows + 1, left=length)
        row, start = self.rows, self.hi - length
        for layer, (k, v) in enumerate(kv):
            self.keys[layer][row, :, start : self.hi] = k
            self.values[layer][row, :, start : self.hi] = v
        self.requests.append(request)
        self.starts.append(start)
        self.lo = min(self.lo, start) if row else start

    def remove(self, row: int) -> None:
        """Drop ``row``: the last row moves into its place."""
        last = self.rows - 1
        if row != last:
            start = self.starts[last]
            for buffers in (self.keys, self.values):
                for t in buffers:
                    t[row, :, start : self.hi] = t[last, :, start : self.hi]
            self.starts[row], self.requests[row] = start, self.requests[last]
        self.starts.pop()
        self.requests.pop()
        self.lo = min(self.starts, default=self.hi)

    def states(self, row: int) -> KV:
        """A copy of ``row``'s states, to outlive the batch."""
        cols = slice(self.starts[row], self.hi)
        pairs = zip(self.keys, self.values, strict=True)
        return [(k[row, :, cols].clone(), v[row, :, cols].clone()) for k, v in pairs]

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention mask [rows, used + 1] and position ids [rows, 1] of the next decoding step."""
        if self.hi == self.keys[0].shape[2]:
            self._reallocate(rows=self.rows, left=0)
        starts = torch.tensor(self.starts, device=self.device)
        columns = torch.arange(self.lo, self.hi + 1, device=self.device)
        mask = columns[None, :] >= starts[:, None]
        return mask, (self.hi - starts)[:, None]

    def advance(self) -> None:
        """The step's column is written: it now belongs to every row."""
        self.hi += 1

    def release(self) -> None:
        """Free the buffers (the loop is idle); the next ``add`` allocates again."""
        self.keys, self.values, self.requests, self.starts, self.cache = [], [], [], [], None
        self.lo = self.hi = 0

    def _zeros(self, like: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
        """A zeroed buffer [rows, heads, columns, head_dim] for states shaped like ``like`` (..., heads, n, dim)."""
        shape = (rows, like.shape[-3], columns, like.shape[-1])
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _allocate(self, kv: KV, *, rows: int, hi: int, columns: int) -> None:
        self.keys = [self._zeros(k, rows, columns) for k, _ in kv]
        self.values = [self._zeros(v, rows, columns) for _, v in kv]
        self.lo = self.hi = hi
        self.cache = Cache(layers=[_RowLayer(self, i) for i in range(len(kv))])

    def _reallocate(self, *, rows: int, left: int) -> None:
        """New buffers with room for ``rows`` rows and ``left`` columns before ``hi``, plus slack.

        One buffer at a time is replaced, so memory peaks at the batch plus one layer's buffer."""
        used, count = self.hi - self.lo, len(self.requests)
        capacity = self.keys[0].shape[0]
        rows = max(rows, min(2 * capacity, self.max_rows)) if rows > capacity else capacity
        slack = SLACK + used // 8
        hi = max(used, left) + slack
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                buffers[i] = self._zeros(old, rows, hi + slack)
                buffers[i][:count, :, hi - used : hi] = old[:count, :, self.lo : self.hi]
                del old
        self.starts = [s + hi - self.hi for s in self.starts]
        self.lo, self.hi = hi - used, hi
