"""Helpers for recipe scripts (``examples/*/recipe.py``): each stage is a ``palaestra`` command.

A recipe runs the CLI in a subprocess per stage, printed before it runs with its wall-clock time
and the machine's load after it, so every stage can be rerun by hand; ``train`` resumes a stopped
training stage from its last checkpoint and skips a finished one, so running a recipe again after
an interruption continues where it stopped. The readers below take what a stage left on disk: a
saved evaluation's metric means, its per-example rewards (for paired intervals), an RL run's
held-out evaluations.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path


def palaestra(*argv: object, echo: bool = True) -> str:
    """Run one ``palaestra`` command in this Python; print it, its time and the load. ``echo``: its
    output goes straight to the terminal (returns ""); else only the saved run's path is printed,
    and its stdout is returned. A failed command ends the recipe (``SystemExit``)."""
    command = [sys.executable, "-m", "palaestra.cli", *map(str, argv)]
    print("\n$ palaestra " + shlex.join(command[3:]), flush=True)
    start = time.perf_counter()
    # one torch thread per process unless told otherwise: the evaluations run beside training,
    # and on a small machine two processes of two threads each run many times slower than one
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(command, stdout=None if echo else subprocess.PIPE, text=True, env=env)
    out = done.stdout or ""
    print("".join(line for line in out.splitlines(keepends=True) if line.startswith("saved:")), end="")
    if done.returncode:
        raise SystemExit(f"failed with exit status {done.returncode}")
    print(f"[{time.perf_counter() - start:.0f} s; {os.popen('uptime').read().strip()}]", flush=True)
    return out


def train(kind: str, config: Path, run: Path, *overrides: object, nproc: int = 1) -> None:
    """``palaestra train KIND``, or its ``--resume`` if an earlier run stopped part way; nothing if
    done. ``nproc`` > 1: data-parallel over that many processes."""
    if (run / "final").exists():
        print(f"\n{kind}: {run} is done (its final checkpoint is there)")
        return
    processes = ("--nproc", nproc) if nproc > 1 else ()
    if (run / "checkpoints").exists() and any((run / "checkpoints").glob("step-*[0-9]")):
        palaestra("train", kind, "--resume", run, "--quiet", *processes)
        return
    if run.exists():  # started but stopped before its first checkpoint: start it again
        shutil.rmtree(run)
    palaestra("train", kind, config, "--output.dir", run, "--quiet", *overrides, *processes)


def saved_run(stdout: str) -> Path:
    """The run folder a ``palaestra eval`` printed (``saved: PATH``)."""
    return Path(
        next(
            line.removeprefix("saved: ") for line in stdout.splitlines() if line.startswith("saved: ")
        ).strip()
    )


def summary(saved: Path) -> dict[str, float]:
    """A saved evaluation's metric means by name, its mean ``reward``, and ``n`` (rollouts saved)."""
    metadata = json.loads((saved / "metadata.json").read_text())
    means = {name: value["mean"] for name, value in metadata["summary"]["metrics"].items()}
    reward = metadata["summary"]["reward"]["mean"]
    return {**means, "reward": reward, "n": float(metadata["counts"]["saved"])}


def rewards(saved: Path, metric: str | None = None) -> list[float]:
    """Each rollout's reward (or ``metric``) in a saved evaluation, by example id: the values a
    paired interval compares example by example (a failed rollout counts 0)."""
    rows = [json.loads(line) for line in (saved / "results.jsonl").read_text().splitlines() if line]
    rows.sort(key=lambda r: (r["example_id"], r["rollout_index"]))
    return [float((r["metrics"].get(metric) if metric else r["reward"]) or 0.0) for r in rows]


def held_out(run: Path, name: str, *, first: bool) -> Path:
    """The saved evaluation ``name`` of an RL run before its first step (``first``) or after its last."""
    steps = sorted((run / "evals").glob("step-*[0-9]"))
    if not steps:
        raise SystemExit(f"{run} has no held-out evaluations (its config's [eval] sets)")
    return (steps[0] if first else steps[-1]) / name
