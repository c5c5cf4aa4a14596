"""pa.ReplEnv: a persistent Python REPL per rollout through the ``python`` tool, its limits, what
the model reads when a limit stops a call, and the weaker sandbox named wherever a run is shown."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import palaestra as pa
from palaestra.eval.summary_view import render_summary
from palaestra.repl import live_workers
from palaestra.sandbox import WEAK_NOTE, ReplLimits
from palaestra.testing.repl import code_policy, sandbox_problem, sandbox_processes

PROBLEM = sandbox_problem()
needs_bwrap = pytest.mark.skipif(PROBLEM is not None, reason=f"no bubblewrap sandbox here: {PROBLEM}")
FAST = ReplLimits(call_seconds=1.5, call_cpu_seconds=1, memory_mb=256, output_chars=300)


async def play(*codes: str, limits: ReplLimits = FAST, **kwargs: object) -> pa.Rollout:
    env = pa.ReplEnv(dataset=[{"question": "go"}], limits=limits, **kwargs)  # type: ignore[arg-type]
    [rollout] = await env.run(pa.ScriptedClient(code_policy(*codes)))
    assert live_workers() == 0
    return rollout


def results(rollout: pa.Rollout) -> list[str]:
    return [str(m["content"]) for m in rollout.completion if m["role"] == "tool"]


@needs_bwrap
async def test_state_persists_and_the_model_reads_output_value_and_exception() -> None:
    rollout = await play(
        "import math\nx = math.sqrt(16)\nprint('hello'); import sys; print('oops', file=sys.stderr)",
        "x + 1",
        "{}['missing']",
        "print('z' * 1000)",
    )
    state, value, error, long = results(rollout)
    assert state == "hello\n[stderr]\noops"
    assert value == "[value]\n5.0"
    assert "KeyError: 'missing'" in error and 'File "<cell 3>", line 1' in error
    assert long.startswith("z" * 300) and "[... 701 more characters of stdout cut: it had 1,001" in long
    assert rollout.metrics["repl_calls"] == 4 and rollout.metrics["repl_errors"] == 1
    assert rollout.metrics["repl_restarts"] == 0 and rollout.stop_reason == "no_tool_calls"
    assert set(rollout.metrics) >= {"python_calls", "repl_kills", "repl_seconds", "repl_cpu_seconds"}


@needs_bwrap
async def test_a_call_past_a_limit_is_killed_and_the_model_is_told_its_state_is_lost() -> None:
    start = time.monotonic()
    cpu_bound = ReplLimits(call_seconds=20, call_cpu_seconds=1)  # the kernel stops it after 1-2 s of CPU
    [cpu] = results(await play("while True:\n    pass", limits=cpu_bound))
    assert cpu.startswith("Error: the worker died (it used up its CPU time)."), cpu
    assert time.monotonic() - start < 10
    rollout = await play(
        "x = 1",
        "import time\ntime.sleep(60)",  # wall time: the session stops it at 1.5 s
        "x",
        "import os\nos._exit(7)",  # the worker kills itself
        "while True:\n    print('y' * 10_000)",  # prints gigabytes until a limit stops it
        "1 + 1",
    )
    _, sleep, lost, exits, prints, after = results(rollout)
    assert "Its state is lost: the next call starts a new worker." in sleep
    assert lost.startswith("[A new worker: variables, imports and files of earlier calls are gone.]")
    assert "NameError: name 'x' is not defined" in lost
    assert "ran past its 1.5 s of wall time and was killed" in sleep
    assert "the worker died (it exited with status 7)" in exits
    assert prints.startswith("[A new worker") and "Error: " in prints and len(prints) < 1000
    assert after.endswith("[value]\n2")
    assert (
        rollout.error is None and rollout.metrics["repl_kills"] == 3 and rollout.metrics["repl_restarts"] == 3
    )
    assert not sandbox_processes()


@needs_bwrap
async def test_a_rollout_that_used_its_budget_runs_no_more_code() -> None:
    limits = ReplLimits(call_seconds=0.5, rollout_seconds=0.8, output_chars=300)
    rollout = await play("import time\ntime.sleep(5)", "import time\ntime.sleep(5)", "1", limits=limits)
    first, second, third = results(rollout)
    assert "ran past its 0.5 s" in first and "ran past its 0.3 s" in second
    assert third == "Error: this rollout has used all its wall time for code; no more code runs."


@needs_bwrap
async def test_the_rollout_timeout_kills_the_worker() -> None:
    rollout = await play("import time\ntime.sleep(60)", limits=ReplLimits(call_seconds=30), timeout=1.0)
    assert rollout.stop_reason == "timeout" and rollout.error is not None
    assert rollout.metrics["repl_calls"] == 1
    assert not sandbox_processes()


@needs_bwrap
async def test_a_worker_that_cannot_start_ends_the_rollout_at_stage_tool() -> None:
    env = pa.ReplEnv(dataset=[{"question": "go"}], limits=FAST)
    env.sandbox.python = "/nonexistent/python"  # the sandbox was checked; the interpreter went away since
    [rollout] = await env.run(pa.ScriptedClient(code_policy("1")))
    assert rollout.error is not None and rollout.error.stage == "tool"
    assert rollout.error.type == "WorkerStartError" and "did not start" in rollout.error.message


def test_bad_limits_are_one_clear_error() -> None:
    with pytest.raises(ValueError, match="limits: call_seconds must be a positive number"):
        ReplLimits(call_seconds=0)
    with pytest.raises(ValueError, match="limits: unknown wall; the limits are: call_cpu_seconds"):
        ReplLimits.from_dict({"wall": 3})
    with pytest.raises(ValueError, match="memory_mb must be an integer ≥ 64"):
        ReplLimits.from_dict({"memory_mb": 1})


async def test_the_weaker_sandbox_is_named_in_the_metadata_and_the_summary(tmp_path: Path) -> None:
    env = pa.ReplEnv(dataset=[{"question": "go"}], limits=FAST, sandbox="rlimits")
    run = await pa.evaluate(
        env, pa.ScriptedClient(code_policy("x = 2\nx * 21")), output_dir=tmp_path, env_id="repl"
    )
    assert results(run.rollouts[0]) == ["[value]\n42"]
    assert run.metadata.notes == {"sandbox": WEAK_NOTE} and run.metadata.summary["notes"] == {
        "sandbox": WEAK_NOTE
    }
    assert run.path is not None
    saved = json.loads((run.path / "metadata.json").read_text())
    assert saved["notes"]["sandbox"].startswith("weaker sandbox (rlimits only)")
    assert pa.load_run(run.path).metadata.notes == {"sandbox": WEAK_NOTE}
    from rich.console import Console

    console = Console(record=True, width=200)
    render_summary(console, run.metadata.summary)
    assert "note: sandbox: weaker sandbox (rlimits only)" in console.export_text()
    assert live_workers() == 0
    if PROBLEM is None:  # the default sandbox says nothing
        default = await pa.evaluate(
            pa.ReplEnv(dataset=[{"question": "go"}]), pa.ScriptedClient(code_policy("1")), output_dir=None
        )
        assert default.metadata.notes == {} and "notes" not in default.metadata.summary


def test_a_mixture_names_the_weaker_sandbox_of_its_member() -> None:
    group = pa.EnvGroup(
        {
            "code": pa.ReplEnv(dataset=[{"question": "go"}], sandbox="rlimits"),
            "text": pa.load_environment("reverse_text", num_examples=2),
        }
    )
    assert group.run_notes() == {"code: sandbox": WEAK_NOTE}
