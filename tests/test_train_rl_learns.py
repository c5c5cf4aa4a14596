"""RL must make a model better, on this CPU: a tiny model warmed up by SFT on the heuristic
teacher's games, then trained with CISPO against a mixed opponent, wins more of a fixed held-out
set of games than its SFT start, and does not when the learning rate is 0.

The recipe is the tiny one of ``examples/tictactoe`` at a smaller scale (fewer teacher games,
fewer RL steps): games cut at three replies, sampled at temperature 0.7, so that a 0.13M-parameter
model learns from every step. Everything is seeded and runs on one thread: the run is
deterministic on a given machine.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import palaestra as pa

pytest.importorskip("torch")
pytest.importorskip("transformers")
tictactoe = pytest.importorskip("tictactoe")

pytestmark = pytest.mark.slow

ENV = {"min_random_move_prob": 0.3, "max_random_move_prob": 1.0, "max_turns": 3}
HELD_OUT = {"num_examples": 128, "seed": 1000, **ENV}


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SFT start: 150 steps on the wins and draws of 600 heuristic-teacher games (~40 s)."""
    from palaestra.data.rollouts import save_dataset
    from palaestra.train import SFTConfig, load_config, train_sft

    root = tmp_path_factory.mktemp("rl-learns")
    env = pa.load_environment("tictactoe", num_examples=600, seed=1)
    games = asyncio.run(env.run(pa.ScriptedClient(tictactoe.heuristic_player), pa.RunSpec()))
    kept = [g for g in games if (g.metrics["won"] or g.metrics["drew"]) and not g.metrics["invalid_moves"]]
    save_dataset(kept, root / "teacher")
    config = load_config(
        SFTConfig,
        Path(__file__).parents[1] / "examples" / "tictactoe" / "tiny.toml",
        {"data.path": str(root / "teacher"), "output.dir": str(root / "sft")},
    )
    run_dir = train_sft(config, progress=False)
    return run_dir / "final"


def rl_run(model: Path, out: Path, lr: float) -> list[dict[str, float]]:
    from palaestra.train import load_config
    from palaestra.train.rl import train_rl
    from palaestra.train.rl_config import RLConfig

    overrides = {
        "model.path": str(model),
        "output.dir": str(out),
        "optim.lr": repr(lr),
        "train.steps": "16",
        "eval.every": "0",
        "eval.num_examples": "128",
        "eval.sets": f"[{{name = 'held-out', args = {_toml(HELD_OUT)}}}]",
        "output.sample_every": "0",
        "output.save_every": "0",
    }
    config = load_config(
        RLConfig, Path(__file__).parents[1] / "examples" / "tictactoe" / "tiny-rl.toml", overrides
    )
    train_rl(config, progress=False)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _toml(args: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k} = {v}" for k, v in args.items()) + "}"


def test_cispo_wins_more_held_out_games_than_the_sft_start(sft_model: Path, tmp_path: Path) -> None:
    records = rl_run(sft_model, tmp_path / "rl", lr=1e-3)
    before, after = records[0], records[-1]
    assert before["step"] == 0 and after["step"] == 16
    gain = after["eval/held-out/reward"] - before["eval/held-out/reward"]
    wins = after["eval/held-out/won"] - before["eval/held-out/won"]
    print(f"held-out reward {before['eval/held-out/reward']:.3f} -> {after['eval/held-out/reward']:.3f}, "
          f"won {before['eval/held-out/won']:.3f} -> {after['eval/held-out/won']:.3f}")  # fmt: skip
    # measured here: reward 0.158 -> 0.233 and wins 2.3% -> 9.4% of the 128 held-out games
    assert gain >= 0.03, (before["eval/held-out/reward"], after["eval/held-out/reward"])
    assert wins >= 0.03, (before["eval/held-out/won"], after["eval/held-out/won"])


def test_with_a_learning_rate_of_0_nothing_is_learned(sft_model: Path, tmp_path: Path) -> None:
    records = rl_run(sft_model, tmp_path / "rl", lr=0.0)
    before, after = records[0], records[-1]
    # the same weights play the same seeded held-out games: the very same reward
    assert after["eval/held-out/reward"] == before["eval/held-out/reward"]
    assert all(r["loss"] is not None for r in records[1:])  # the updates ran; they moved nothing
