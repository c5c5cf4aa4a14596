"""Evaluation: saved runs, metadata, resume after a kill, datasets, and the eval command."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import reverse_text

import palaestra as pa
from palaestra.cli import main
from palaestra.data.rollouts import messages_from_row
from palaestra.eval.store import RunStore
from palaestra.testing import FakeOpenAIServer


def env() -> pa.Environment:
    return pa.load_environment("reverse_text", num_examples=10)


def noisy() -> pa.ScriptedClient:
    return pa.ScriptedClient(reverse_text.noisy_reverser, model="noisy")


def key(r: pa.Rollout) -> tuple[int, int]:
    return (r.example_id, r.rollout_index)


async def test_evaluate_saves_every_rollout_and_the_metadata(tmp_path: Path) -> None:
    run = await pa.evaluate(
        env(),
        noisy(),
        pa.RunSpec(num_examples=6, rollouts_per_example=2, seed=1),
        output_dir=tmp_path,
        env_id="reverse_text",
    )
    assert run.path is not None and run.path.parent.parent == tmp_path / "evals"
    assert run.path.parent.name == "reverse_text--noisy"
    lines = (run.path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 12
    meta = json.loads((run.path / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["counts"] == {"expected": 12, "saved": 12, "errors": 0}
    assert (meta["env_id"], meta["model"], meta["seed"], meta["num_examples"]) == (
        "reverse_text",
        "noisy",
        1,
        6,
    )
    assert meta["versions"]["palaestra"] == pa.__version__
    assert meta["versions"]["env_package"] == "palaestra-env-reverse-text 0.1.0"
    assert meta["started_at"] <= meta["finished_at"]
    assert meta["summary"]["n_rollouts"] == 12
    rewards = [r.reward for r in run.rollouts]
    assert meta["summary"]["reward"]["mean"] == pytest.approx(sum(rewards) / len(rewards))
    loaded = pa.load_run(run.path)
    assert [r.to_dict() for r in loaded.rollouts] == [r.to_dict() for r in run.rollouts]
    assert loaded.summary == run.summary


async def test_in_memory_evaluation_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = await pa.evaluate(
        env(), noisy(), pa.RunSpec(num_examples=2, rollouts_per_example=2), output_dir=None
    )
    assert run.path is None and len(run.rollouts) == 4
    assert list(tmp_path.iterdir()) == []


async def test_a_cancelled_run_is_saved_as_interrupted_with_whole_groups(tmp_path: Path) -> None:
    delivered = asyncio.Event()
    count = 0

    async def slow(messages: pa.Messages, rng) -> str:
        await asyncio.sleep(0.01 + rng.random() * 0.02)
        return reverse_text.oracle(messages)

    def seen(_: pa.Rollout) -> None:
        nonlocal count
        count += 1
        if count >= 6:
            delivered.set()

    task = asyncio.create_task(
        pa.evaluate(
            env(),
            pa.ScriptedClient(slow, model="slow"),
            pa.RunSpec(num_examples=10, rollouts_per_example=3, max_concurrent=2),
            output_dir=tmp_path,
            on_rollout=seen,
        )
    )
    await delivered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (run_dir,) = (tmp_path / "evals").glob("*/*")
    meta = json.loads((run_dir / "metadata.json").read_text())
    saved, skipped = RunStore.open(run_dir).load_rollouts()
    assert meta["status"] == "interrupted" and skipped == []
    assert 6 <= len(saved) < 30 and len(saved) % 3 == 0  # whole groups only
    assert meta["counts"]["saved"] == len(saved)


async def test_resume_keeps_whole_groups_and_drops_a_torn_write(tmp_path: Path) -> None:
    first = await pa.evaluate(
        env(), noisy(), pa.RunSpec(num_examples=8, rollouts_per_example=2, seed=5), output_dir=tmp_path
    )
    assert first.path is not None
    results = first.path / "results.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    by_key = {key(pa.Rollout.from_dict(json.loads(line))): line for line in lines}
    # keep examples 0-2 whole, half of example 3, and a line torn in the middle of a write
    kept = [by_key[(e, i)] for e in range(3) for i in range(2)] + [by_key[(3, 0)]]
    results.write_text("".join(kept) + by_key[(4, 0)][:40])
    meta = json.loads((first.path / "metadata.json").read_text())
    meta["status"] = "interrupted"
    (first.path / "metadata.json").write_text(json.dumps(meta))

    resumed = await pa.evaluate(
        env(),
        noisy(),
        pa.RunSpec(num_examples=8, rollouts_per_example=2, seed=5),
        output_dir=tmp_path,
        resume=first.path,
    )
    assert sorted(key(r) for r in resumed.rollouts) == [(e, i) for e in range(8) for i in range(2)]

    def replay(r: pa.Rollout) -> tuple:
        return (r.seed, r.completion, r.reward, r.metrics, r.stop_reason)

    # the same seed replays the same rollouts
    assert [replay(r) for r in resumed.rollouts] == [replay(r) for r in first.rollouts]
    on_disk, skipped = RunStore.open(first.path).load_rollouts()
    assert skipped == [] and sorted(key(r) for r in on_disk) == sorted(key(r) for r in resumed.rollouts)
    assert resumed.metadata.status == "complete"


@pytest.mark.slow
async def test_resume_after_sigkill_gives_exactly_n_times_r(tmp_path: Path) -> None:
    async def slow_reverse(body: dict) -> str:
        await asyncio.sleep(0.05)
        return f"<reversed_text>{body['messages'][-1]['content'][::-1]}</reversed_text>"

    async with FakeOpenAIServer(slow_reverse) as server:
        args = ["reverse_text", "-m", server.model, "-b", server.base_url, "-n", "30", "-r", "2", "-c", "4"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "palaestra.cli",
            "eval",
            *args,
            "-o",
            str(tmp_path),
            "--quiet",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        results = None
        for _ in range(400):  # wait until some groups are saved, then kill without warning
            await asyncio.sleep(0.025)
            found = list(tmp_path.glob("evals/*/*/results.jsonl"))
            if found and len(found[0].read_bytes().splitlines()) >= 10:
                results = found[0]
                break
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
        assert results is not None, "the run saved nothing before the kill"
        saved_before = len(results.read_bytes().splitlines())
        assert saved_before < 60
        assert json.loads((results.parent / "metadata.json").read_text())["status"] == "running"

        resume = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "palaestra.cli",
            "eval",
            "--resume",
            str(results.parent),
            "--quiet",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, err = await resume.communicate()
    assert resume.returncode == 0, err.decode()
    run = pa.load_run(results.parent)
    assert sorted(key(r) for r in run.rollouts) == [(e, i) for e in range(30) for i in range(2)]
    assert run.metadata.status == "complete" and run.metadata.counts["saved"] == 60
    assert all(r.reward == 1.0 for r in run.rollouts)


async def test_cli_eval_saves_a_dataset_and_passes_sampling_through(tmp_path: Path) -> None:
    async with FakeOpenAIServer(lambda body: "<reversed_text>x</reversed_text>") as server:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "palaestra.cli",
            "eval",
            "reverse_text",
            "-m",
            server.model,
            "-b",
            server.base_url,
            "-n",
            "3",
            "-r",
            "2",
            "-S",
            '{"top_p": 0.5, "top_k": 7}',
            "-T",
            "0.3",
            "-o",
            str(tmp_path / "out"),
            "--save-dataset",
            str(tmp_path / "ds"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert {(b["top_p"], b["top_k"], b["temperature"]) for b in server.requests} == {(0.5, 7, 0.3)}
    ds = datasets.load_from_disk(str(tmp_path / "ds"))
    assert len(ds) == 6
    assert {
        "prompt",
        "completion",
        "answer",
        "info",
        "reward",
        "lcs_reward",
        "format_reward",
        "error",
    } <= set(ds.column_names)
    assert messages_from_row(ds[0]["completion"]) == [
        {"role": "assistant", "content": "<reversed_text>x</reversed_text>"}
    ]
    run = pa.load_run(next((tmp_path / "out" / "evals").glob("*/*")))
    assert sorted(ds["reward"]) == sorted(r.reward for r in run.rollouts)
    assert "saved:" in out.decode() and "eval 6/6" in err.decode()  # plain progress off a terminal


def test_cli_eval_uses_the_environments_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # reverse_text's pyproject.toml says 20 examples × 3 rollouts
    code = main(
        ["eval", "reverse_text", "-m", "scripted:reverse_text:oracle", "-o", str(tmp_path), "--quiet"]
    )
    assert code == 0
    run = pa.load_run(next((tmp_path / "evals").glob("*/*")))
    assert len(run.rollouts) == 60 and run.metadata.spec.num_examples == 20
    assert "60 rollouts" in capsys.readouterr().out


def test_unreachable_server_fails_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "reverse_text", "-m", "m", "-b", "http://127.0.0.1:9/v1", "-o", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:9/v1" in err and err.count("\n") == 1
    assert not (tmp_path / "evals").exists()  # nothing was started


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-n", "4"], "--resume uses the run's saved settings; drop -n"),
        (["reverse_text"], "drop ENV"),
    ],
)
def test_resume_refuses_conflicting_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert (
        main(
            [
                "eval",
                "reverse_text",
                "-m",
                "scripted:reverse_text:oracle",
                "-n",
                "2",
                "-r",
                "1",
                "-o",
                str(tmp_path),
            ]
        )
        == 0
    )
    run_dir = next((tmp_path / "evals").glob("*/*"))
    capsys.readouterr()
    assert main(["eval", "--resume", str(run_dir), *extra]) == 2
    assert message in capsys.readouterr().err


def test_resume_of_a_missing_or_foreign_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--resume", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["eval", "--resume", str(tmp_path)]) == 2
    assert "not a run directory (no results.jsonl)" in capsys.readouterr().err


def test_eval_without_an_environment_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "-m", "scripted:reverse_text:oracle"]) == 2
    assert "give an environment (or --resume RUN_DIR)" in capsys.readouterr().err


def test_report_command_writes_one_page_for_several_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for policy in ("oracle", "noisy_reverser"):
        argv = ["eval", "reverse_text", "-m", f"scripted:reverse_text:{policy}", "-n", "3", "-r", "2"]
        assert main([*argv, "-o", str(tmp_path), "--quiet"]) == 0
    runs = sorted((tmp_path / "evals").glob("*/*"))
    out = tmp_path / "both.html"
    assert main(["report", *map(str, runs), "-o", str(out)]) == 0
    page = out.read_text()
    for run in runs:
        assert pa.load_run(run).metadata.run_id in page
    capsys.readouterr()
    assert main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "missing" in err and err.count("\n") == 1
