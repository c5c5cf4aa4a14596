"""Configs of tiny training runs for tests: SFT of a tiny model built from its `[model.tiny]` table
(the trainer tests and the environments' smoke tests), and a few RL steps of the result on an
environment. An environment's smoke test shows that it trains end to end (data, prompts, tools,
scoring), not that anything is learned."""

from __future__ import annotations

from pathlib import Path

RL = """
[model]
path = "{model}"

[env]
id = "{env_id}"
args = {env_args}

[sampling]
max_tokens = 16

[train]
steps = 2
batch_size = 4
rollouts_per_example = 2
threads = 1

[eval]
num_examples = 2

[output]
dir = "{run}"
"""


def sft_toml(
    path: Path,
    data: Path,
    run: Path,
    *,
    steps: int = 3,
    batch_size: int = 4,
    lr: float | None = 1e-2,
    length: int = 2048,
    vocab_size: int = 600,
    heads: tuple[int, int] | None = (2, 1),
    micro_batch_tokens: int = 8192,
    output: str = "",
) -> Path:
    """Write to ``path`` SFT of a tiny model (32 wide, one layer) on the saved dataset ``data`` into
    ``run``: ``length`` is its longest sequence and position, ``heads`` its attention and key-value
    heads (None: the tiny model's defaults), ``lr`` None the trainer's default; ``output`` adds
    lines to `[output]`."""
    optim = f"[optim]\nlr = {lr!r}\n" if lr is not None else ""
    attention = f"num_heads = {heads[0]}\nnum_kv_heads = {heads[1]}\n" if heads else ""
    path.write_text(f"""[data]
path = "{data}"
max_length = {length}

[model.tiny]
vocab_size = {vocab_size}
hidden_size = 32
intermediate_size = 64
num_layers = 1
{attention}max_positions = {length}

{optim}
[train]
steps = {steps}
batch_size = {batch_size}
micro_batch_tokens = {micro_batch_tokens}
threads = 1

[output]
dir = "{run}"
{output}
""")
    return path


def rl_toml(path: Path, model: Path, run: Path, env_id: str, env_args: str) -> Path:
    """Write to ``path`` 2 RL steps of ``model`` (4 rollouts each) on ``env_id`` with ``env_args``
    (a TOML inline table), into ``run``."""
    path.write_text(RL.format(model=model, run=run, env_id=env_id, env_args=env_args))
    return path
