"""Teacher data and evaluation sets that share prompts: the SFT run records its prompts, and
``palaestra eval -m CHECKPOINT`` warns when the examples it runs are among them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import palaestra as pa
from palaestra.cli import main
from palaestra.testing.train_smoke import sft_toml
from palaestra.train.overlap import PROMPTS_FILE, overlapping, prompt_key, train_prompts_for

pytest.importorskip("torch")
pytest.importorskip("transformers")
double_check = pytest.importorskip("double_check")


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SFT step of a tiny model on 8 teacher conversations of double_check (seed 0)."""
    tmp = tmp_path_factory.mktemp("overlap")
    env = pa.load_environment("double_check", num_examples=8, seed=0)
    rollouts = asyncio.run(env.run(pa.ScriptedClient(double_check.stubborn), pa.RunSpec()))
    data = tmp / "teacher.jsonl"
    data.write_text("".join(json.dumps({"messages": r.messages}) + "\n" for r in rollouts))
    config = sft_toml(
        tmp / "sft.toml",
        data,
        tmp / "run",
        steps=1,
        batch_size=2,
        lr=None,
        length=256,
        vocab_size=300,
        heads=None,
        micro_batch_tokens=1024,
    )
    assert main(["train", "sft", str(config), "--quiet"]) == 0
    return tmp / "run"


def test_an_sft_run_records_the_prompts_it_trains_on(sft_run: Path) -> None:
    env = pa.load_environment("double_check", num_examples=8, seed=0)
    saved = json.loads((sft_run / PROMPTS_FILE).read_text())
    assert sorted(saved["prompts"]) == sorted({prompt_key(e.prompt) for e in env.examples})
    for model in (sft_run, sft_run / "final", (sft_run / "final").resolve()):
        found = train_prompts_for(model)
        assert found is not None and found[0] == sft_run.resolve()


def test_eval_warns_when_its_examples_were_trained_on(
    sft_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "eval",
        "double_check",
        "-m",
        str(sft_run / "final"),
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "2",
        "-o",
        str(tmp_path),
        "--quiet",
    ]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "warning: 4 of the 4 examples to run were prompts of the SFT data" in err
    assert main([*args, "-a", '{"seed": 7}']) == 0
    assert "overlaps the training data" not in capsys.readouterr().err


def test_a_prompt_that_opens_several_examples_is_not_an_overlap(
    sft_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tic-tac-toe's examples share ten openings and differ after them (the opponent's seed): a
    model trained on games of seed 1 evaluated on games of seed 0 shares every opening, and that is
    not evaluating on its training data."""
    pytest.importorskip("tictactoe")
    run = tmp_path / "run"
    run.mkdir()
    (run / "final").symlink_to((sft_run / "final").resolve())
    teacher = {
        prompt_key(e.prompt) for e in pa.load_environment("tictactoe", num_examples=50, seed=1).examples
    }
    assert len(teacher) < 50  # the openings repeat
    (run / PROMPTS_FILE).write_text(json.dumps({"data": "teacher", "prompts": sorted(teacher)}))
    prompts = [e.prompt for e in pa.load_environment("tictactoe", num_examples=200, seed=0).examples]
    assert {prompt_key(p) for p in prompts[:2]} <= teacher  # the two games to run open as teacher games do
    env_args = '{"num_examples": 200, "seed": 0, "max_turns": 1}'
    args = ["eval", "tictactoe", "-m", str(run / "final"), "-a", env_args, "-n", "2", "-r", "1", "-t", "2"]
    assert main([*args, "-o", str(tmp_path / "out"), "--quiet"]) == 0
    assert "overlaps the training data" not in capsys.readouterr().err
    trained = {prompt_key(p) for p in prompts}
    assert overlapping(prompts, trained, prompts) == 0  # ten openings, each of many games
    # the same opening in a dataset where it opens one example alone identifies that example
    assert overlapping(prompts[:1], trained, prompts[:1]) == 1
