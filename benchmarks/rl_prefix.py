"""RL's shared-prefix update (``train.share_prefix``) against the full forward pass, same batches.

Two RL runs of the committed tic-tac-toe student (``tests/fixtures/tictactoe-sft``: a 0.13M Llama
after SFT), one after the other, from the same checkpoint and seed: whole games, temperature 1,
CISPO, ``--games`` a step, no held-out games. The sampler is the in-process one, so both runs
sample the same games (their rewards are compared) and differ only in how the update runs: with
the start every sequence shares (the system prompt) run once a pass, or run for every sequence.
Prints each run's training seconds per step and their ratio (the reference: share_prefix = false).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rl_prefix.py        # ~2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDENT = ROOT / "tests" / "fixtures" / "tictactoe-sft"
CONFIG = ROOT / "examples" / "tictactoe" / "tiny-rl.toml"


def run(out: Path, share: bool, steps: int, games: int) -> list[dict[str, float]]:
    command = [
        sys.executable,
        "-m",
        "palaestra.cli",
        "train",
        "rl",
        str(CONFIG),
        "--quiet",
        "--model.path",
        str(STUDENT),
        "--output.dir",
        str(out),
        "--train.steps",
        str(steps),
        "--train.batch_size",
        str(games),
        "--train.max_concurrent",
        str(games),
        "--train.threads",
        "1",
        "--eval.every",
        "0",
        "--eval.sets",
        "[]",
        "--eval.num_examples",
        "1",
        "--output.save_every",
        "0",
        "--output.sample_every",
        "0",
        "--train.share_prefix",
        str(share).lower(),
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--games", type=int, default=96)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {share: run(Path(tmp) / str(share), share, args.steps, args.games) for share in (False, True)}
    same = all(a["reward"] == b["reward"] for a, b in zip(rows[False], rows[True], strict=True))
    print(f"{args.steps} steps of {args.games} games; the same games both ways: {same}")
    print("| share_prefix | shared tokens | trained tokens/step | training s/step (median) | ÷ full |")
    print("|---|---|---|---|---|")
    full = statistics.median(r["seconds_training"] for r in rows[False][1:])  # the first step warms up
    for share in (False, True):
        seconds = statistics.median(r["seconds_training"] for r in rows[share][1:])
        shared = rows[share][-1].get("shared_prefix", 0)
        tokens = statistics.mean(r["trained_tokens"] for r in rows[share])
        print(f"| {str(share).lower()} | {shared} | {tokens:.0f} | {seconds:.2f} | {seconds / full:.2f} |")


if __name__ == "__main__":
    main()
