"""Hardening of saved runs: damaged files, resume rules, locks, dying servers, signals, progress."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import palaestra as pa
from palaestra.cli import main
from palaestra.eval.store import RunStore
from palaestra.eval.summary import summarize
from palaestra.testing import reverse_reply
from palaestra.testing import served_in_thread as served

POLICIES = """
import asyncio, os
import reverse_text, tictactoe

CALLS = []

def _delay():
    return float(os.environ.get("HPOL_DELAY", "0"))

async def oracle(messages):
    CALLS.append(1)
    await asyncio.sleep(_delay())
    return reverse_text.oracle(messages)

async def ttt(messages, rng):
    await asyncio.sleep(_delay())
    return tictactoe.heuristic_player(messages, rng)
"""
ORACLE = "scripted:hpolicies:oracle"


@pytest.fixture
def policies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """Scripted policies in a module of their own (``hpolicies``), importable here and by subprocesses."""
    (tmp_path / "hpolicies.py").write_text(POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("hpolicies", None)
    yield importlib.import_module("hpolicies")
    sys.modules.pop("hpolicies", None)


@pytest.fixture(autouse=True)
def _no_ambient_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def new_run(out: Path, *args: str, env: str = "reverse_text", model: str = ORACLE) -> Path:
    """Run ``palaestra eval`` (in this process) and return the run folder."""
    assert main(["eval", env, "-m", model, *args, "-o", str(out), "--quiet"]) == 0
    (run_dir,) = (out / "evals").glob("*/*")
    return run_dir


def as_interrupted(run_dir: Path) -> None:
    """Empty the results and mark the run interrupted: a resume has all of it to run."""
    (run_dir / "results.jsonl").write_text("")
    meta = json.loads((run_dir / "metadata.json").read_text())
    meta["status"] = "interrupted"
    (run_dir / "metadata.json").write_text(json.dumps(meta))


def keys(run_dir: Path) -> list[tuple[int, int]]:
    """(example, index) of every results line, in file order; every line must be a rollout."""
    saved, skipped = RunStore.open(run_dir).load_rollouts()
    assert skipped == []
    return [(r.example_id, r.rollout_index) for r in saved]


def full(n: int, r: int) -> list[tuple[int, int]]:
    return [(e, i) for e in range(n) for i in range(r)]


def assert_one_line_error(err: str, *fragments: str) -> None:
    assert err.startswith("palaestra: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err


# --- damaged files --------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["example_id_x", "null", "json_string", "torn"])
def test_resume_drops_damaged_lines_and_reruns_their_groups(
    tmp_path: Path, policies: ModuleType, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    run_dir = new_run(tmp_path / "out", "-n", "3", "-r", "2")
    results = run_dir / "results.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    (at,) = [
        i
        for i, line in enumerate(lines)
        if (json.loads(line)["example_id"], json.loads(line)["rollout_index"]) == (1, 0)
    ]
    row = json.loads(lines[at])
    bad = {
        "example_id_x": json.dumps({**row, "example_id": "x"}) + "\n",
        "null": "null\n",
        "json_string": json.dumps(lines[at]) + "\n",
        "torn": "",
    }[damage]
    tail = lines[at][:60] if damage == "torn" else ""  # a write cut short by a kill: no newline
    results.write_text("".join(lines[:at]) + bad + "".join(lines[at + 1 :]) + tail)
    policies.CALLS.clear()
    capsys.readouterr()

    assert main(["eval", "--resume", str(run_dir), "-m", ORACLE, "--quiet"]) == 0
    assert "1 unreadable lines dropped" in capsys.readouterr().out
    assert len(policies.CALLS) == 2  # example 1's group, and only it, ran again
    assert sorted(keys(run_dir)) == full(3, 2)  # exactly n×r, no duplicates
    run = pa.load_run(run_dir)
    assert run.metadata.status == "complete" and run.metadata.counts["saved"] == 6


@pytest.mark.parametrize(("field", "value"), [("num_examples", "ten"), ("env_args", [1])])
def test_resume_of_bad_metadata_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any
) -> None:
    run_dir = new_run(tmp_path / "out", "-n", "2", "-r", "1", model="scripted:reverse_text:oracle")
    meta = json.loads((run_dir / "metadata.json").read_text())
    meta[field] = value
    (run_dir / "metadata.json").write_text(json.dumps(meta))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    capsys.readouterr()
    assert main(["eval", "--resume", str(run_dir), "-m", "scripted:reverse_text:oracle"]) == 2
    assert_one_line_error(capsys.readouterr().err, "metadata.json", field)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


@pytest.mark.parametrize(
    "damage", [{"reward": 3}, {"metrics": {"x": "y"}}, {"histogram": {"counts": "z"}}], ids=str
)
def test_report_recomputes_a_summary_of_the_wrong_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: dict[str, Any]
) -> None:
    run_dir = new_run(tmp_path / "out", "-n", "3", "-r", "2", model="scripted:reverse_text:noisy_reverser")
    meta = json.loads((run_dir / "metadata.json").read_text())
    good = meta["summary"]
    meta["summary"] = {**good, **damage}
    (run_dir / "metadata.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 0
    assert capsys.readouterr().err == ""
    assert (run_dir / "report.html").is_file()
    run = pa.load_run(run_dir)
    assert run.summary == good == summarize(run.rollouts, rollouts_per_example=2)


# --- what --resume may and may not change ---------------------------------------------------


def test_resume_talks_to_a_new_url_with_a_new_key_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with served(reverse_reply) as first:
        run_dir = new_run(tmp_path / "out", "-n", "3", "-r", "2", "-b", first.base_url, model=first.model)
    as_interrupted(run_dir)
    monkeypatch.setenv("OTHER_VAR", "sekrit")
    with served(reverse_reply, api_key="sekrit") as second:
        capsys.readouterr()
        assert main(["eval", "--resume", str(run_dir), "-b", second.base_url, "--quiet"]) == 2
        assert_one_line_error(capsys.readouterr().err, "401")  # the saved key variable has no key
        assert second.request_count == 0
        argv = ["eval", "--resume", str(run_dir), "-b", second.base_url, "-k", "OTHER_VAR", "--quiet"]
        assert main(argv) == 0
        assert second.request_count == 6
    assert sorted(keys(run_dir)) == full(3, 2)
    assert pa.load_run(run_dir).metadata.counts == {"expected": 6, "saved": 6, "errors": 0}


@pytest.mark.parametrize("flag", [["--seed", "5"], ["-o", "elsewhere"]])
def test_resume_refuses_to_change_the_seed_or_the_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: list[str]
) -> None:
    run_dir = new_run(tmp_path / "out", "-n", "2", "-r", "1", model="scripted:reverse_text:oracle")
    as_interrupted(run_dir)
    capsys.readouterr()
    assert main(["eval", "--resume", str(run_dir), "-m", "scripted:reverse_text:oracle", *flag]) == 2
    assert_one_line_error(capsys.readouterr().err, f"drop {flag[0]}")
    assert keys(run_dir) == []


def test_a_saved_scripted_model_is_never_imported_from_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = new_run(tmp_path / "out", "-n", "2", "-r", "1", model="scripted:reverse_text:oracle")
    as_interrupted(run_dir)
    meta_path = run_dir / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "model": "scripted:this:x"}))
    monkeypatch.delitem(sys.modules, "this", raising=False)  # importing it prints the Zen of Python
    capsys.readouterr()
    assert main(["eval", "--resume", str(run_dir)]) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(err, "-m scripted:this:x")
    assert main(["eval", "--resume", str(run_dir), "-m", "scripted:reverse_text:oracle"]) == 2
    out2, err2 = capsys.readouterr()
    assert_one_line_error(err2, "differs")
    assert "Beautiful is better than ugly" not in out + err + out2 + err2
    assert "this" not in sys.modules

    meta_path.write_text(json.dumps(meta))  # the real policy: resumes once -m repeats it
    assert main(["eval", "--resume", str(run_dir)]) == 2
    assert_one_line_error(capsys.readouterr().err, "-m scripted:reverse_text:oracle")
    assert main(["eval", "--resume", str(run_dir), "-m", "scripted:reverse_text:oracle", "--quiet"]) == 0
    assert sorted(keys(run_dir)) == full(2, 1)


# --- locks ------------------------------------------------------------------------------------


def test_a_run_in_use_cannot_be_resumed_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = new_run(tmp_path / "out", "-n", "2", "-r", "1", model="scripted:reverse_text:oracle")
    as_interrupted(run_dir)
    capsys.readouterr()
    with RunStore(run_dir).lock():
        assert main(["eval", "--resume", str(run_dir), "-m", "scripted:reverse_text:oracle"]) == 2
    assert_one_line_error(capsys.readouterr().err, f"in use by process {os.getpid()}")
    assert keys(run_dir) == []
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "interrupted"


def test_a_stale_lock_of_a_dead_process_is_taken_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = new_run(tmp_path / "out", "-n", "2", "-r", "2", model="scripted:reverse_text:oracle")
    as_interrupted(run_dir)
    (run_dir / "run.lock").write_text("process 999999")  # its writer died: no OS lock is held
    with caplog.at_level(logging.WARNING, logger="palaestra"):
        assert main(["eval", "--resume", str(run_dir), "-m", "scripted:reverse_text:oracle", "--quiet"]) == 0
    assert "stale lock of process 999999" in caplog.text
    assert sorted(keys(run_dir)) == full(2, 2)
    assert pa.load_run(run_dir).metadata.status == "complete"
    assert not (run_dir / "run.lock").exists()  # a finished run leaves no lock file


# --- servers that die or hang -----------------------------------------------------------------


def test_a_server_that_dies_mid_run_stops_it_resumably(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    served_so_far = 0

    def dies_after_four(body: dict[str, Any]) -> Any:
        nonlocal served_so_far
        served_so_far += 1
        return reverse_reply(body) if served_so_far <= 4 else {"fault": "close"}

    args = ["-n", "6", "-r", "2", "-c", "1", "--max-failures-in-a-row", "5", "--max-retries", "0"]
    with served(dies_after_four) as dying:
        argv = ["eval", "reverse_text", "-m", dying.model, "-b", dying.base_url, *args]
        assert main([*argv, "-o", str(tmp_path), "--quiet"]) == 1
    (run_dir,) = (tmp_path / "evals").glob("*/*")
    err = capsys.readouterr().err
    assert "stopped" in err and f"palaestra eval --resume {run_dir}" in err and "Traceback" not in err
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "interrupted"
    saved, _ = RunStore.open(run_dir).load_rollouts()
    failed_groups = {r.example_id for r in saved if r.error is not None and r.error.stage == "model"}
    good_groups = {r.example_id for r in saved} - failed_groups
    assert good_groups and failed_groups  # some groups were saved whole, some saved with model errors

    with served(reverse_reply) as live:
        assert main(["eval", "--resume", str(run_dir), "-b", live.base_url, "--quiet"]) == 0
        assert live.request_count == 12 - 2 * len(good_groups)
    run = pa.load_run(run_dir)
    assert sorted(keys(run_dir)) == full(6, 2)
    assert all(r.error is None and r.reward == 1.0 for r in run.rollouts)
    assert run.metadata.status == "complete"


def test_a_hanging_server_fails_requests_within_the_request_timeout(tmp_path: Path) -> None:
    with served(lambda body: {"fault": "hang"}) as hanging:
        argv = ["eval", "reverse_text", "-m", hanging.model, "-b", hanging.base_url, "-n", "4", "-r", "1"]
        start = time.monotonic()
        code = main([*argv, "--request-timeout", "0.3", "--max-retries", "0", "-o", str(tmp_path), "--quiet"])
        elapsed = time.monotonic() - start
    assert code in (0, 1) and elapsed < 15  # not hung: 0.3 s per attempt
    run = pa.load_run(next((tmp_path / "evals").glob("*/*")))
    assert run.rollouts and all(r.error is not None and r.error.stage == "model" for r in run.rollouts)
    assert all("0.3s" in r.error.message for r in run.rollouts if r.error is not None)


# --- signals and kills (subprocesses) ---------------------------------------------------------


def spawn_eval(tmp_path: Path, delay: float, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HPOL_DELAY": str(delay)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "palaestra.cli", "eval", *args, "-o", str(tmp_path / "out"), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for(path_glob: str, root: Path, min_lines: int = 0, limit: float = 60) -> Path:
    """The first file matching ``path_glob`` under ``root`` once it has ``min_lines`` lines."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for found in root.glob(path_glob):
            if len(found.read_bytes().splitlines()) >= min_lines:
                return found
        time.sleep(0.02)
    raise AssertionError(f"nothing like {path_glob} under {root} within {limit} s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_sigterm_and_sighup_save_the_run_as_interrupted(
    tmp_path: Path, policies: ModuleType, sig: signal.Signals
) -> None:
    proc = spawn_eval(tmp_path, 0.2, "reverse_text", "-m", ORACLE, "-n", "20", "-r", "1", "-c", "2")
    try:
        meta_path = wait_for("out/evals/*/*/metadata.json", tmp_path)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert json.loads(meta_path.read_text())["status"] == "interrupted"
    assert f"palaestra eval --resume {meta_path.parent}" in err and "Traceback" not in err


def test_groups_are_saved_steadily_and_a_killed_run_resumes_to_n_times_r(
    tmp_path: Path, policies: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    ttt = "scripted:hpolicies:ttt"
    proc = spawn_eval(tmp_path, 0.05, "tictactoe", "-m", ttt, "-n", "12", "-r", "2", "-c", "2")
    try:
        results = wait_for("out/evals/*/*/results.jsonl", tmp_path, min_lines=2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    saved, _ = RunStore.open(results.parent).load_rollouts()
    whole = [e for e, count in Counter(r.example_id for r in saved).items() if count == 2]
    assert 0 < len(whole) < 12  # some whole groups were on disk before the kill, not all
    assert json.loads((results.parent / "metadata.json").read_text())["status"] == "running"

    monkeypatch.setenv("HPOL_DELAY", "0")
    assert main(["eval", "--resume", str(results.parent), "-m", ttt, "--quiet"]) == 0
    assert sorted(keys(results.parent)) == full(12, 2)
    assert pa.load_run(results.parent).metadata.status == "complete"


# --- errors, environment mistakes, progress -------------------------------------------------


def always_one() -> float:
    return 1.0


class SetupFails(pa.MultiTurnEnv):
    async def setup_state(self, state: pa.State) -> None:
        if state.example.row["question"] == "setup fails":
            raise RuntimeError("no board for you")

    async def env_response(self, messages: pa.Messages, state: pa.State) -> pa.Messages:
        return [{"role": "user", "content": "again"}]


async def test_errored_rollouts_are_not_scored(tmp_path: Path) -> None:
    def policy(messages: pa.Messages) -> str:
        if messages[-1]["content"] == "model fails":
            raise RuntimeError("the policy broke")
        return "fine"

    questions = ["ok", "setup fails", "model fails", "ok too"]
    env = SetupFails(
        dataset=[{"question": q} for q in questions], rubric=pa.Rubric([always_one]), max_turns=1
    )
    run = await pa.evaluate(
        env, pa.ScriptedClient(policy), pa.RunSpec(rollouts_per_example=2), output_dir=tmp_path
    )
    stages = {r.example_id: r.error.stage if r.error else None for r in run.rollouts}
    assert stages == {0: None, 1: "env", 2: "model", 3: None}
    assert [r.reward for r in run.rollouts] == [1.0, 1.0, None, None, None, None, 1.0, 1.0]
    assert run.path is not None
    summary = pa.load_run(run.path).summary
    assert summary["reward"]["mean"] == 1.0 and summary["reward"]["n"] == 4  # errors left out
    assert summary["pass_at_k"]["1"] == 0.5  # and counted as fails
    assert sorted((e["stage"], e["count"]) for e in summary["errors"]) == [("env", 2), ("model", 2)]
    assert run.metadata.counts == {"expected": 8, "saved": 8, "errors": 4}


def test_multiturn_mistakes_are_found_when_the_environment_is_built() -> None:
    rows = [{"question": "q"}]

    class NoResponse(pa.MultiTurnEnv):
        pass

    class SyncResponse(pa.MultiTurnEnv):
        def env_response(self, messages: pa.Messages, state: pa.State) -> pa.Messages:  # type: ignore[override]
            return []

    class SyncSetup(SetupFails):
        def setup_state(self, state: pa.State) -> None:  # type: ignore[override]
            pass

    class Foreign(SetupFails):
        def is_completed(self, state: pa.State) -> bool:
            return True

    with pytest.raises(TypeError, match="must implement env_response"):
        NoResponse(dataset=rows)
    with pytest.raises(TypeError, match=r"SyncResponse.env_response must be an async method"):
        SyncResponse(dataset=rows)
    with pytest.raises(TypeError, match=r"SyncSetup.setup_state must be an async method"):
        SyncSetup(dataset=rows)
    with pytest.warns(UserWarning, match=r"Foreign.is_completed is never called"):
        Foreign(dataset=rows)


async def test_plain_progress_beats_before_any_rollout_finishes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("palaestra.eval.progress.HEARTBEAT", 0.05)

    async def slow(messages: pa.Messages) -> str:
        await asyncio.sleep(0.4)
        return "done"

    before_first: list[str] = []

    def first_rollout(_: pa.Rollout) -> None:
        if not before_first:
            before_first.append(capsys.readouterr().err)

    env = pa.SingleTurnEnv(dataset=[{"question": "a"}, {"question": "b"}], rubric=pa.Rubric([always_one]))
    spec = pa.RunSpec(rollouts_per_example=1)
    client = pa.ScriptedClient(slow)
    await pa.evaluate(env, client, spec, output_dir=None, progress=None, on_rollout=first_rollout)
    (early,) = before_first
    assert any(line.startswith("eval 0/2 ") for line in early.splitlines()), early
    assert "eval 2/2 " in capsys.readouterr().err
