"""What a newcomer runs into from the command line: a policy in a file next to them, and the
``--resume`` hint of a scripted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from processes import default_sigint

POLICIES = """
import asyncio

def reverse(messages):
    return "<reversed_text>" + messages[-1]["content"][::-1] + "</reversed_text>"

async def slow(messages):
    await asyncio.sleep(60)
    return "too late"
"""


def palaestra(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "palaestra.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_policy_in_a_file_here_is_found_without_pythonpath(tmp_path: Path) -> None:
    (tmp_path / "my_policies.py").write_text(POLICIES)
    done = palaestra(
        tmp_path,
        "eval",
        "reverse_text",
        "-m",
        "scripted:my_policies:reverse",
        "-n",
        "2",
        "-r",
        "1",
        "--quiet",
    )
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "outputs" / "evals").glob("reverse_text--*/*/results.jsonl"))


def test_a_policy_that_is_not_here_says_where_it_is_looked_for(tmp_path: Path) -> None:
    done = palaestra(tmp_path, "eval", "reverse_text", "-m", "scripted:elsewhere:reverse", "-n", "1")
    assert done.returncode == 2
    line = done.stderr.strip()
    assert "elsewhere.py" in line and "PYTHONPATH" in line and len(line.splitlines()) == 1


def test_the_resume_hint_of_a_scripted_run_repeats_its_model(tmp_path: Path) -> None:
    (tmp_path / "my_policies.py").write_text(POLICIES)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "palaestra.cli",
            "eval",
            "reverse_text",
            "-m",
            "scripted:my_policies:slow",
            "-n",
            "2",
            "-r",
            "1",
            "--quiet",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    deadline = time.monotonic() + 60
    while not list((tmp_path / "outputs").glob("evals/*/*/metadata.json")):
        assert time.monotonic() < deadline and proc.poll() is None, "the run did not start"
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    (run_dir,) = (tmp_path / "outputs" / "evals").glob("*/*")
    hint = (
        f"resume with: palaestra eval --resume {run_dir.relative_to(tmp_path)} -m scripted:my_policies:slow"
    )
    assert hint in err.strip()
