"""A leaderboard shows a name for a local checkpoint, never its path on the uploader's disk, and
no copy of a run on the hub (its record, its report) names the endpoint it was served from."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import palaestra as pa
from palaestra.eval.store import RunMetadata, RunStore
from palaestra.eval.summary import summarize
from palaestra.hub.client import attach_results, upload
from palaestra.hub.results import public_model_name
from palaestra.runner import run_async
from palaestra.testing.hub import build_dists, hub_process, write_env_package

CHECKPOINT = "/home/alice/secret-project/outputs/sft/checkpoints/step-000040"


@pytest.mark.parametrize(
    ("model", "shown"),
    [
        (CHECKPOINT, "local:sft/step-000040"),
        ("outputs/sft/final", "local:sft/final"),
        ("./final", "local:final"),
        ("local:/data/models/qwen", "local:models/qwen"),
        ("~/models/mine", "local:models/mine"),
        ("C:\\Users\\bob\\run\\checkpoints\\step-000002", "local:run/step-000002"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        ("gpt-4.1-mini", "gpt-4.1-mini"),
        ("scripted:echo_env:solve", "scripted:echo_env:solve"),
    ],
)
def test_a_path_becomes_a_name(model: str, shown: str) -> None:
    assert public_model_name(model) == shown


def write_run(path: Path, model: str) -> Path:
    rollouts = [
        pa.Rollout(
            i,
            0,
            0,
            [{"role": "user", "content": f"Repeat: w{i}"}],
            [{"role": "assistant", "content": f"w{i}"}],
            reward=1.0,
            metrics={"exact": 1.0},
        )
        for i in range(2)
    ]
    path.mkdir(parents=True)
    store = RunStore(path)
    store.rewrite(rollouts)
    store.write_metadata(
        RunMetadata(
            env_id="echo",
            model=model,
            spec=pa.RunSpec(num_examples=2),
            run_id="r1",
            base_url="http://gpu-box.internal:8000/v1",
            api_key_var="MY_KEY",
            status="complete",
            counts={"expected": 2, "saved": 2, "errors": 0},
            summary=summarize(rollouts, rollouts_per_example=1),
        )
    )
    return path


def test_an_attached_checkpoint_run_shows_a_name_and_keeps_the_path_private(tmp_path: Path) -> None:
    data = tmp_path / "hub-data"
    token = subprocess.run(
        [sys.executable, "-m", "palaestra.cli", "hub", "token", "alice", "--data", str(data)],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ,
    ).stdout.strip()
    dists = build_dists(write_env_package(tmp_path / "src"), tmp_path / "dist")
    run_dir = write_run(tmp_path / "run", CHECKPOINT)
    with hub_process(data) as (url, _):
        run_async(upload(url, token, dists))
        done = run_async(attach_results(url, token, run_dir))
        with urllib.request.urlopen(f"{url}env/palaestra-env-echo/", timeout=30) as response:
            page = response.read().decode()
        (result_id,) = {part.split("/")[0] for part in page.split("results/")[1:] if "/report.html" in part}
        with urllib.request.urlopen(f"{url}results/{result_id}/report.html", timeout=30) as response:
            report = response.read().decode()
    assert done["project"] == "palaestra-env-echo"
    assert "local:sft/step-000040" in page and "local:sft/step-000040" in report
    for private in ("/home/alice", "secret-project", "gpu-box", "MY_KEY"):
        assert private not in page and private not in report, private
