"""Experiment tracking: both trainers send every step to TensorBoard and W&B (offline), read back here.

TensorBoard's event files are read with TensorBoard's own reader; W&B's offline run file
(``run-ID.wandb``, a LevelDB-style log of protobuf records) with the record types W&B ships.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.cli import main
from palaestra.testing.train_smoke import rl_toml
from palaestra.train import checkpoint as ckpt
from palaestra.train import tracking

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tensorboard")
pytest.importorskip("wandb")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """W&B offline, its caches in the test's folder, no prompt for an account."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))


@pytest.fixture(scope="module")
def chats(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": f"{w} {w}."}]}
        for w in ("cat", "dog", "bird", "tree", "house", "mat", "red", "blue")
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sft_config(tmp_path: Path, chats: Path, model: Path, tracking_names: str) -> Path:
    path = tmp_path / "sft.toml"
    path.write_text(f"""
[data]
path = "{chats}"
max_length = 64

[model]
path = "{model}"

[train]
steps = 4
batch_size = 2
micro_batch_tokens = 256
threads = 1

[output]
dir = "{tmp_path / "run"}"
save_every = 2
tracking = {tracking_names}
""")
    return path


def metrics(run_dir: Path) -> dict[int, dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record for record in map(json.loads, lines)}


def tensorboard_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar TensorBoard shows for the run: tag → step → value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / tracking.TENSORBOARD_DIR))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def wandb_history(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The config and the logged rows of the one offline W&B run under ``run_dir/wandb``."""
    from wandb.proto import wandb_internal_pb2

    (log,) = (run_dir / tracking.WANDB_DIR).glob("offline-run-*/run-*.wandb")
    data, pos, chunks, pending = log.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):  # 32 KiB blocks of records: 4-byte CRC, 2-byte length, 1-byte type
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # the rest of the block is padding
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # full, first / middle, last
        if kind in (1, 4):
            chunks.append(pending)
    config: dict[str, Any] = {}
    rows = []
    for chunk in chunks:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        if record.HasField("history"):
            rows.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif record.HasField("run"):
            config = {_key(i): json.loads(i.value_json) for i in record.run.config.update}
    return config, rows


def _key(item: Any) -> str:
    """A W&B item's key: ``key``, or the parts of ``nested_key`` (as newer versions write it)."""
    return item.key or "/".join(item.nested_key)


def test_sft_steps_reach_tensorboard_and_wandb_as_metrics_jsonl_has_them(
    tmp_path: Path, chats: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = sft_config(tmp_path, chats, tiny_model_dir, '["tensorboard", "wandb"]')
    assert main(["train", "sft", str(config), "--quiet"]) == 0, capsys.readouterr().err
    run_dir = tmp_path / "run"
    logged = metrics(run_dir)
    scalars = tensorboard_scalars(run_dir)
    assert scalars["loss"] == pytest.approx({s: r["loss"] for s, r in logged.items()})
    assert set(scalars["grad_norm"]) == {1, 2, 3, 4} and "tokens_per_s" in scalars
    wandb_config, rows = wandb_history(run_dir)
    assert [row["_step"] for row in rows] == [1, 2, 3, 4]
    assert [row["loss"] for row in rows] == pytest.approx([logged[s]["loss"] for s in (1, 2, 3, 4)])
    assert wandb_config["train"]["steps"] == 4 and wandb_config["output"]["tracking"] == [
        "tensorboard",
        "wandb",
    ]


def test_a_resumed_run_shows_each_step_once_in_tensorboard(
    tmp_path: Path, chats: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = sft_config(tmp_path, chats, tiny_model_dir, '["tensorboard"]')
    real_save = ckpt.save_checkpoint

    def die_at_the_last(run_dir: Path, step: int, **kwargs: Any) -> Path:
        if step == 4:  # steps 3 and 4 are logged, then the process dies: the resume repeats them
            raise KeyboardInterrupt
        return real_save(run_dir, step, **kwargs)

    monkeypatch.setattr(ckpt, "save_checkpoint", die_at_the_last)
    assert main(["train", "sft", str(config), "--quiet"]) == 130
    monkeypatch.setattr(ckpt, "save_checkpoint", real_save)
    run_dir = tmp_path / "run"
    assert main(["train", "sft", "--resume", str(run_dir), "--quiet"]) == 0
    scalars = tensorboard_scalars(run_dir)
    assert scalars["loss"] == pytest.approx({s: r["loss"] for s, r in metrics(run_dir).items()})
    assert sorted(scalars["loss"]) == [1, 2, 3, 4]


def test_rl_steps_and_held_out_evaluations_reach_both_trackers(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from palaestra.train import rl_rollouts

    def load(name: str, **kwargs: Any) -> pa.Environment:
        rows = [{"question": f"say something {i + kwargs.get('seed', 0)}"} for i in range(4)]
        return pa.SingleTurnEnv(dataset=rows, rubric=pa.Rubric([lambda completion: 0.5]))

    monkeypatch.setattr(rl_rollouts, "load_environment", load)
    config = rl_toml(
        tmp_path / "rl.toml",
        tiny_model_dir,
        tmp_path / "run",
        "toy",
        max_tokens=4,
        eval='num_examples = 2\nsets = [{name = "held-out", args = {seed = 100}}]',
        output='sample_every = 0\ntracking = ["tensorboard", "wandb"]',
    )
    assert main(["train", "rl", str(config), "--quiet"]) == 0, capsys.readouterr().err
    run_dir = tmp_path / "run"
    scalars = tensorboard_scalars(run_dir)
    assert scalars["reward"] == pytest.approx({1: 0.5, 2: 0.5})
    assert scalars["eval/held-out/reward"] == pytest.approx({0: 0.5, 2: 0.5})  # before training, and after
    _, rows = wandb_history(run_dir)
    assert [row["_step"] for row in rows] == [0, 1, 2]
    assert rows[0]["eval/held-out/reward"] == 0.5 and rows[1]["reward"] == 0.5


def test_a_tracker_whose_package_is_missing_is_one_line_before_anything_is_written(
    tmp_path: Path,
    chats: Path,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(tracking._PACKAGES, "wandb", "palaestra_no_such_module")
    config = sft_config(tmp_path, chats, tiny_model_dir, '["wandb"]')
    assert main(["train", "sft", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install 'palaestra[wandb]'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()
    assert main(["train", "sft", str(config), "--output.tracking", '["mlflow"]']) == 2
    assert "tracking" in capsys.readouterr().err
