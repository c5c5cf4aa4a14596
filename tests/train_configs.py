"""The SFT config the trainer tests share: a tiny Llama built from its `[model.tiny]` table, one
thread, a few steps; each test says only what it needs to be different."""

from __future__ import annotations

from pathlib import Path


def tiny_sft_toml(
    path: Path,
    data: Path,
    out: Path,
    *,
    steps: int,
    batch_size: int,
    lr: float | None = None,
    output: str = "",
) -> Path:
    """Write to ``path`` an SFT config on ``data`` into ``out``; ``output`` adds lines to `[output]`."""
    optim = f"[optim]\nlr = {lr!r}\n" if lr is not None else ""
    path.write_text(f"""[data]
path = "{data}"
max_length = 256

[model.tiny]
vocab_size = 300
hidden_size = 32
intermediate_size = 64
num_layers = 1
max_positions = 256

{optim}
[train]
steps = {steps}
batch_size = {batch_size}
micro_batch_tokens = 1024
threads = 1

[output]
dir = "{out}"
{output}
""")
    return path
