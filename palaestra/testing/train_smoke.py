"""Configs of tiny training runs for tests: SFT of a tiny model built from its `[model.tiny]` table
(the trainer tests and the environments' smoke tests), and a few RL steps of the result on an
environment. An environment's smoke test shows that it trains end to end (data, prompts, tools,
scoring), not that anything is learned."""

from __future__ import annotations

from pathlib import Path

# reverse_text whose prompts fit the tests' tiny models (256 positions): with the default system
# prompt they are 280-330 tokens, every rollout fails and the run stops at its first step
REVERSE_TEXT_ARGS = '{num_examples = 4, seed = 15, system_prompt = "Reverse the text."}'


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


def rl_toml(
    path: Path,
    model: Path | None,
    run: Path,
    env_id: str,
    env_args: str = "{}",
    *,
    model_table: str = "",
    max_tokens: int = 16,
    steps: int = 2,
    batch_size: int = 4,
    rollouts_per_example: int = 2,
    lr: float | None = None,
    train: str = "",
    eval: str = "num_examples = 2",
    output: str = "",
) -> Path:
    """Write to ``path`` ``steps`` RL steps of the checkpoint ``model`` (or of the `[model]` table
    ``model_table``, given as text) on ``env_id`` with ``env_args`` (a TOML inline table), into
    ``run``: ``batch_size`` rollouts a step, ``rollouts_per_example`` a group, one thread; ``lr``
    None the trainer's default; ``train``, ``eval`` and ``output`` are more lines of `[train]`,
    `[eval]` and `[output]`."""
    table = model_table or f'[model]\npath = "{model}"\n'
    optim = f"[optim]\nlr = {lr!r}\n" if lr is not None else ""
    path.write_text(f"""{table}
[env]
id = "{env_id}"
args = {env_args}

[sampling]
max_tokens = {max_tokens}

{optim}
[train]
steps = {steps}
batch_size = {batch_size}
rollouts_per_example = {rollouts_per_example}
threads = 1
{train}

[eval]
{eval}

[output]
dir = "{run}"
{output}
""")
    return path
