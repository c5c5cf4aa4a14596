"""A training run that goes wrong keeps what it did: a disk that fills stops it with one line (which
path, how much space) and the checkpoint before stays loadable; a run that stopped before its
first checkpoint starts over with ``--resume``; a damaged checkpoint is one line; ``--resume``
says where ``RUN_DIR/final`` pointed before and after, and a run started from a ``final`` link
keeps the checkpoint it pointed to."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from palaestra.cli import main
from palaestra.testing.train_smoke import REVERSE_TEXT_ARGS
from palaestra.testing.train_smoke import rl_toml as tiny_rl_toml
from palaestra.testing.train_smoke import sft_toml as tiny_sft_toml
from palaestra.train import checkpoint as ckpt

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def games(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "games.jsonl"
    rows = [
        {
            "messages": [
                {"role": "user", "content": "Free cells: 0, 1, 2. Your move."},
                {
                    "role": "assistant",
                    "content": f"<think>Cell {i % 3} is free.</think>\n<move>{i % 3}</move>",
                },
            ]
        }
        for i in range(8)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sft_toml(tmp_path: Path, games: Path) -> Path:
    return tiny_sft_toml(
        tmp_path / "sft.toml",
        games,
        tmp_path / "run",
        steps=3,
        batch_size=4,
        lr=1e-3,
        length=256,
        vocab_size=300,
        heads=None,
        micro_batch_tokens=1024,
        output="save_every = 1",
    )


def rl_toml(tmp_path: Path, model: Path, out: str = "run") -> Path:
    return tiny_rl_toml(
        tmp_path / f"{out}.toml",
        model,
        tmp_path / out,
        "reverse_text",
        REVERSE_TEXT_ARGS,
        max_tokens=8,
        steps=3,
        eval="",
        output="save_every = 1\nsample_every = 0",
    )


@pytest.fixture(params=["sft", "rl"])
def trainer(
    request: pytest.FixtureRequest, tmp_path: Path, games: Path, tiny_model_dir: Path
) -> tuple[str, Path]:
    """(``sft`` or ``rl``, a config of 3 steps, each saved, into ``tmp_path / "run"``)."""
    if request.param == "sft":
        return "sft", sft_toml(tmp_path, games)
    return "rl", rl_toml(tmp_path, tiny_model_dir)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str) -> str:
    """The one ``palaestra: error:`` line of ``err`` (which has no traceback)."""
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("palaestra:")]
    assert line.startswith("palaestra: error: ")
    return line


def steps_logged(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_disk_that_fills_during_a_checkpoint_stops_the_run_and_keeps_the_one_before(
    capsys: pytest.CaptureFixture[str], trainer: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    kind, config = trainer
    run_dir = config.parent / "run"
    real_save = torch.save

    def full_at_step_3(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        path = Path(f)
        if path.name == ckpt.STATE_FILE and path.parent.name == "step-000003.tmp":
            path.write_bytes(b"\0" * 100)  # some of it went out before the disk filled
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_at_step_3)
    code, _, err = run_cli(capsys, "train", kind, config, "--quiet")
    assert code == 1
    line = error_line(err)
    assert line.startswith(
        f"palaestra: error: step 3: cannot write the checkpoint {run_dir / 'checkpoints' / 'step-000003'}: "
        "No space left on device (it needs about "
    ), line
    assert line.endswith(
        f"free on that disk); the last good checkpoint is {run_dir / 'checkpoints' / 'step-000002'}"
    )
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000001", "step-000002"]
    assert not (run_dir / "final").exists()
    kept = run_dir / "checkpoints" / "step-000002"
    assert ckpt.load_state(kept)["step"] == 2  # intact and loadable
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(kept) is not None

    monkeypatch.setattr(torch, "save", real_save)  # space freed: the run goes on from step 2
    code, _, err = run_cli(capsys, "train", kind, "--resume", run_dir, "--quiet")
    assert code == 0, err
    assert steps_logged(run_dir)[-3:] == [1, 2, 3] and (run_dir / "final").resolve().name == "step-000003"


def test_a_log_write_on_a_full_disk_names_the_file(
    capsys: pytest.CaptureFixture[str], trainer: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from palaestra.train.metrics import MetricsLog

    kind, config = trainer
    run_dir = config.parent / "run"
    real_write = MetricsLog.write

    def full_at_step_2(self: MetricsLog, record: dict[str, Any]) -> None:
        if record["step"] == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        real_write(self, record)

    monkeypatch.setattr(MetricsLog, "write", full_at_step_2)
    code, _, err = run_cli(capsys, "train", kind, config, "--quiet")
    assert code == 1
    line = error_line(err)
    assert f"cannot write {run_dir / 'metrics.jsonl'}: No space left on device (" in line
    assert line.endswith(
        f"free on that disk); the last good checkpoint is {run_dir / 'checkpoints' / 'step-000001'}"
    )


def test_a_run_that_stopped_before_its_first_checkpoint_starts_over_with_resume(
    capsys: pytest.CaptureFixture[str], trainer: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    kind, config = trainer
    run_dir = config.parent / "run"
    if kind == "sft":  # a NaN at step 1
        from palaestra.train import sft

        real = sft.token_loss_sum
        monkeypatch.setattr(sft, "token_loss_sum", lambda *args: real(*args) * math.nan)
    else:  # Ctrl-C while step 1 samples

        async def interrupted(*args: Any) -> Any:
            raise KeyboardInterrupt

        monkeypatch.setattr("palaestra.train.rl.collect", interrupted)
    code, _, err = run_cli(capsys, "train", kind, config, "--quiet")
    if kind == "sft":
        assert code == 1 and "step 1: the loss is nan" in error_line(err)
    else:
        assert code == 130 and f"--resume {run_dir}" in err
    assert (run_dir / "config.toml").is_file() and not (run_dir / "checkpoints").exists()
    monkeypatch.undo()

    code, _, err = run_cli(capsys, "train", kind, config, "--quiet")  # the same config again
    assert code == 2
    assert f"stopped before its first checkpoint; start it over with --resume {run_dir}" in error_line(err)
    code, _, err = run_cli(capsys, "train", kind, "--resume", run_dir, "--quiet", "--train.steps", "2")
    assert code == 0, err
    assert steps_logged(run_dir)[-2:] == [1, 2] and (run_dir / "final").resolve().name == "step-000002"
    assert "steps = 2" in (run_dir / "config.toml").read_text()


def test_a_damaged_checkpoint_is_one_line_on_resume(
    capsys: pytest.CaptureFixture[str], trainer: tuple[str, Path]
) -> None:
    kind, config = trainer
    run_dir = config.parent / "run"
    code, _, err = run_cli(capsys, "train", kind, config, "--quiet", "--train.steps", "2")
    assert code == 0, err
    state = run_dir / "checkpoints" / "step-000002" / ckpt.STATE_FILE
    state.write_bytes(b"not a torch file")
    code, _, err = run_cli(capsys, "train", kind, "--resume", run_dir, "--train.steps", "3")
    assert code == 2
    assert f"--resume: {state} cannot be read" in error_line(err)
    assert state.read_bytes() == b"not a torch file"


def test_resume_says_where_final_pointed_and_a_run_from_final_keeps_its_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, games: Path
) -> None:
    sft_run = tmp_path / "run"
    code, out, err = run_cli(
        capsys, "train", "sft", sft_toml(tmp_path, games), "--quiet", "--train.steps", "2"
    )
    assert code == 0, err
    assert f"done: {sft_run / 'final'} -> checkpoints/step-000002;" in out and "pointed to" not in out

    rl_config = rl_toml(tmp_path, sft_run / "final", out="rl")  # RL from the SFT run's final
    code, out, err = run_cli(capsys, "train", "rl", rl_config, "--quiet", "--train.steps", "1")
    assert code == 0, err
    pinned = str(sft_run / "checkpoints" / "step-000002")
    assert f"model: {pinned}," in out
    assert f'path = "{pinned}"' in (tmp_path / "rl" / "config.toml").read_text()

    code, out, err = run_cli(capsys, "train", "sft", "--resume", sft_run, "--quiet", "--train.steps", "3")
    assert code == 0, err
    assert (
        f"done: {sft_run / 'final'} -> checkpoints/step-000003 (it pointed to checkpoints/step-000002 before: "
        f"a config that names {sft_run / 'final'} gets the new checkpoint; "
        f"name {sft_run / 'checkpoints' / 'step-000002'} to keep the old one)" in out
    )
    # the RL run goes on from the model it started with, not from where final points now
    code, out, err = run_cli(
        capsys, "train", "rl", "--resume", tmp_path / "rl", "--quiet", "--train.steps", "2"
    )
    assert code == 0, err
    assert f"model: {pinned}," in out
