"""Configs for an environment's training smoke test: a few SFT steps of a tiny model built from
its `[model.tiny]` table, then a few RL steps of the result on the environment. They show that
the environment trains end to end (data, prompts, tools, scoring), not that anything is learned."""

from __future__ import annotations

from pathlib import Path

SFT = """
[data]
path = "{data}"
max_length = 2048

[model.tiny]
vocab_size = 600
hidden_size = 32
intermediate_size = 64
num_layers = 1
num_heads = 2
num_kv_heads = 1
max_positions = 2048

[optim]
lr = 1e-2

[train]
steps = 3
batch_size = 4
micro_batch_tokens = 8192
threads = 1

[output]
dir = "{run}"
"""

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


def sft_toml(path: Path, data: Path, run: Path) -> Path:
    """Write to ``path`` 3 SFT steps of a tiny model on the saved dataset ``data``, into ``run``."""
    path.write_text(SFT.format(data=data, run=run))
    return path


def rl_toml(path: Path, model: Path, run: Path, env_id: str, env_args: str) -> Path:
    """Write to ``path`` 2 RL steps of ``model`` (4 rollouts each) on ``env_id`` with ``env_args``
    (a TOML inline table), into ``run``."""
    path.write_text(RL.format(model=model, run=run, env_id=env_id, env_args=env_args))
    return path
