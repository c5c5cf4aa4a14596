"""``palaestra train sft`` and ``palaestra train curves`` through the CLI: one line and exit 2 for bad
input (before any work), exit 1 for a diverged run, a checkpoint ``palaestra eval`` loads."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from palaestra.cli import main
from palaestra.testing.train_smoke import sft_toml

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def games(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JSONL file of short chats in the tic-tac-toe reply format."""
    path = tmp_path_factory.mktemp("data") / "games.jsonl"
    rows = []
    for i in range(12):
        cell = i % 9
        rows.append(
            {
                "messages": [
                    {
                        "role": "system",
                        "content": "Play tic-tac-toe. Reply <think>...</think> then <move>N</move>.",
                    },
                    {
                        "role": "user",
                        "content": f"Free cells: {', '.join(str(c) for c in range(9))}. Your move.",
                    },
                    {
                        "role": "assistant",
                        "content": f"<think>Cell {cell} is free.</think>\n<move>{cell}</move>",
                    },
                ]
            }
        )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def config(tmp_path: Path, games: Path) -> Path:
    return sft_toml(
        tmp_path / "sft.toml",
        games,
        tmp_path / "run",
        steps=2,
        lr=1e-3,
        length=256,
        vocab_size=300,
        heads=None,
        micro_batch_tokens=1024,
    )


def run_cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--optim.lrr", "1"], "unknown key --optim.lrr (optim has: lr, schedule,"),
        (["--train.steps", "ten"], "--train.steps must be an integer, got 'ten'"),
        (["--train.steps=2.5"], "train.steps must be an integer, got 2.5 (float)"),
        (
            ["--data.path", "/no/such/games"],
            "data.path: no such dataset folder or JSONL file: /no/such/games",
        ),
        (["--data.max_length", "8"], "shorter than the prompt of row 0"),
        (["--lora.enabled", "true", "--lora.target_modules", '["qkv"]'], "qkv not in the model; its linear"),
        (["--optim.schedule", "linear"], 'optim.schedule must be one of "constant", "cosine", got "linear"'),
        (["--model.path", "smollm2"], "give exactly one of path"),
        (["--optim.lr"], "--optim.lr needs a value"),
    ],
)
def test_bad_config_is_one_line_and_exit_2_before_any_work(
    capsys: pytest.CaptureFixture[str], config: Path, overrides: list[str], message: str
) -> None:
    code, _, err = run_cli(capsys, "train", "sft", config, "--quiet", *overrides)
    assert code == 2
    assert err.startswith("palaestra: error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (config.parent / "run").exists()  # nothing was written


def test_an_empty_dataset_and_a_missing_config_are_one_line(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    code, _, err = run_cli(capsys, "train", "sft", config, "--data.path", empty)
    assert code == 2 and "has no rows" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "train", "sft", tmp_path / "nope.toml")
    assert code == 2 and "config file not found" in err
    code, _, err = run_cli(capsys, "train", "sft")
    assert code == 2 and "give a CONFIG file" in err
    code, _, err = run_cli(capsys, "train", "sft", "--resume", tmp_path)
    assert code == 2 and "no config.toml there" in err


def test_train_resume_eval_and_curves(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    code, out, err = run_cli(capsys, "train", "sft", config, "--quiet", "--output.save_every", "1")
    assert code == 0, err
    assert "data: 12 conversations" in out and "step 2/2" in err
    code, _, err = run_cli(capsys, "train", "sft", config)
    assert code == 2 and "is not empty: resume it with --resume" in err
    code, _, err = run_cli(capsys, "train", "sft", "--resume", run_dir, "--train.steps", "3", "--quiet")
    assert code == 0, err
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    assert "steps = 3" in (run_dir / "config.toml").read_text()  # the resolved config, as run
    assert (run_dir / "final").resolve().name == "step-000003"
    code, _, err = run_cli(capsys, "train", "sft", "--resume", run_dir, "--quiet")
    assert code == 2 and "at step 3 already" in err

    code, _, _ = run_cli(capsys, "train", "curves", run_dir, "-o", tmp_path / "c.html")
    page = (tmp_path / "c.html").read_text()
    assert code == 0 and page.count("<svg") == 4 and "SFT: what it learns" in page
    code, _, err = run_cli(capsys, "train", "curves", tmp_path / "nothing")
    assert code == 2 and "no metrics.jsonl" in err


def test_a_diverged_run_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from palaestra.train import sft

    real_loss = sft.token_loss_sum
    monkeypatch.setattr(sft, "token_loss_sum", lambda *args: real_loss(*args) * math.inf)
    code, _, err = run_cli(capsys, "train", "sft", config, "--quiet")
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("palaestra: error:")]
    assert lines == [
        "palaestra: error: step 1: the loss is inf; stopped before updating the weights; "
        "no checkpoint was saved before it"
    ]
    assert "Traceback" not in err
