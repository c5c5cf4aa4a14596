"""python_tasks: hidden tests run in a fresh sandboxed worker, a solver that passes them, a policy
that fails the ways models fail, and bad arguments refused in one line."""

from __future__ import annotations

import time
from typing import Any

import pytest
import python_tasks as pt
from python_tasks_data import TASKS

import palaestra as pa
from palaestra import sandbox as sandbox_module
from palaestra.cli import main
from palaestra.repl import live_workers
from palaestra.testing.repl import sandbox_problem, sandbox_processes

PROBLEM = sandbox_problem()
needs_bwrap = pytest.mark.skipif(PROBLEM is not None, reason=f"no bubblewrap sandbox here: {PROBLEM}")
QUICK = {"call_seconds": 0.5, "call_cpu_seconds": 1, "output_chars": 500}


def test_the_dataset_holds_the_reference_outputs_and_never_shows_them() -> None:
    rows = pt.make_dataset(12, seed=0)
    assert {r["info"]["task"] for r in rows} == {t.name for t in TASKS}
    assert [r["question"] for r in rows] != [r["question"] for r in pt.make_dataset(12, seed=1)]
    fizz = next(r for r in rows if r["info"]["task"] == "fizzbuzz")
    assert fizz["answer"][2][-1] == "FizzBuzz" and fizz["info"]["tests"][2] == [15]
    fib = next(r for r in rows if r["info"]["task"] == "fibonacci")
    assert fib["answer"][-1] == 12586269025 and not any("12586269025" in r["question"] for r in rows)
    assert all(len(r["answer"]) == len(r["info"]["tests"]) for r in rows)
    assert (
        pt.solution_code("x\n```python\ndef f():\n    pass\n```\nand\n```py\ndef g(): 1\n```")
        == "def g(): 1\n"
    )


@needs_bwrap
async def test_the_solver_passes_every_task() -> None:
    env = pt.load_environment()
    rollouts = await env.run(pa.ScriptedClient(pt.solver))
    assert [r.reward for r in rollouts] == [1.0] * len(TASKS)
    assert all(r.metrics["python_calls"] == 1 and r.metrics["ran"] == 1.0 for r in rollouts)
    first = next(m for m in rollouts[0].completion if m["role"] == "tool")
    assert first["content"].strip()  # the example's output, as the solver printed it
    assert live_workers() == 0 and not sandbox_processes()


@needs_bwrap
async def test_the_flawed_policy_fails_every_way_and_the_run_goes_on() -> None:
    env = pt.load_environment(limits=QUICK, check_seconds=0.5)
    start = time.monotonic()
    rollouts = await env.run(pa.ScriptedClient(pt.flawed), pa.RunSpec(max_concurrent=12))
    assert time.monotonic() - start < 20
    assert [r.reward for r in rollouts] == [0.0] * len(TASKS)
    assert all(r.error is None and r.stop_reason == "answered" for r in rollouts)
    by_flaw: dict[str, list[pa.Rollout]] = {}
    for r in rollouts:
        by_flaw.setdefault(pt.FLAWS[[t.name for t in TASKS].index(r.info["task"]) % 3], []).append(r)
    assert all("SyntaxError" in r.state["check_error"] for r in by_flaw["syntax_error"])
    for r in by_flaw["infinite_loop"] + by_flaw["huge_output"]:
        tool = next(m["content"] for m in r.completion if m["role"] == "tool")
        assert "was killed" in tool and r.metrics["repl_kills"] == 1  # the REPL call was stopped
    assert all("was killed" in r.state["check_error"] for r in by_flaw["infinite_loop"])
    assert all(r.state["outputs"] == [{"ok": "x"}] * len(r.answer) for r in by_flaw["huge_output"])  # wrong
    assert live_workers() == 0 and not sandbox_processes()


@needs_bwrap
async def test_a_partly_right_function_scores_the_share_of_tests_it_passes() -> None:
    env = pt.load_environment()
    gcd = next(e for e in env.examples if e.info["task"] == "gcd")

    def almost(messages: pa.Messages) -> str:  # wrong only when an argument is 0 (2 of the 5 tests)
        return "```python\ndef gcd(a, b):\n    if 0 in (a, b):\n        return -1\n    import math\n    return math.gcd(a, b)\n```"

    rollout = await env.rollout(pa.ScriptedClient(almost), gcd)
    await env.rubric.score_group([rollout], [gcd])
    assert rollout.reward == pytest.approx(3 / 5)


@needs_bwrap
async def test_the_hidden_tests_cannot_be_read_from_the_sandbox() -> None:
    env = pt.load_environment()
    example = next(e for e in env.examples if e.info["task"] == "fibonacci")
    snoop = (
        "```python\nimport os\ndef fibonacci(n):\n"
        "    return os.listdir('/work') + os.listdir('/tmp') + sorted(os.environ)\n```"
    )
    rollout = await env.rollout(pa.ScriptedClient(lambda: snoop), example)
    await env.rubric.score_group([rollout], [example])
    files, *names = rollout.state["outputs"][0]["ok"]
    assert rollout.reward == 0.0 and files == ".palaestra-output"  # its own output file, nothing of the tests
    assert set(names) <= {"HOME", "LANG", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ('{"num_examples": 13}', "there are 12 tasks, not 13"),
        ('{"limits": {"wall": 1}}', "limits: unknown wall"),
        ('{"limits": {"call_seconds": -1}}', "call_seconds must be a positive number"),
        ('{"sandbox": "docker"}', "sandbox must be one of bubblewrap, rlimits"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    args: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["eval", "python_tasks", "-m", "scripted:python_tasks:solver", "-a", args, "-o", "/nonexistent"]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_without_a_sandbox_the_cli_refuses_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    monkeypatch.setattr(sandbox_module, "_checked", set())
    monkeypatch.setattr(sandbox_module.shutil, "which", lambda name: None)
    code = main(["eval", "python_tasks", "-m", "scripted:python_tasks:solver", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "needs bubblewrap, which is not installed" in err and "sandbox='rlimits'" in err
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())  # nothing was started
