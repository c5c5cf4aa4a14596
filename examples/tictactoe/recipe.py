"""The tic-tac-toe SFT recipe end to end: teacher data, filter, SFT, evaluation, a before/after table.

    python examples/tictactoe/recipe.py tiny                 # a tiny model built from a config
    python examples/tictactoe/recipe.py smollm2 --games 20   # SmolLM2-135M-Instruct, full fine-tuning
    python examples/tictactoe/recipe.py smollm2 --games 20 --lora

Every stage is a ``palaestra`` command (printed before it runs, with its wall-clock time and the
machine's load after it), so each can be rerun by hand. Evaluation follows the environment's
protocol: games against the random and the optimal opponent, one rollout each, the
environment's own sampling (temperature 1), replies capped at 64 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
TEACHER = "scripted:tictactoe:heuristic_player"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["tiny", "smollm2"])
    parser.add_argument("--games", type=int, default=100, help="evaluation games per opponent")
    parser.add_argument("--teacher-games", type=int, default=None, help="default: 2000 tiny, 300 smollm2")
    parser.add_argument("--lora", action="store_true", help="LoRA instead of full fine-tuning (smollm2)")
    parser.add_argument("--baseline", action="store_true", help="also evaluate the model before SFT")
    parser.add_argument("--workdir", type=Path, default=Path("outputs/tictactoe"))
    parser.add_argument(
        "overrides", nargs="*", help="config overrides for the SFT run, e.g. --train.steps=40"
    )
    args = parser.parse_args()
    name = args.model + ("-lora" if args.lora else "")
    work = args.workdir / name
    teacher_games = args.teacher_games or (2000 if args.model == "tiny" else 300)

    teacher = args.workdir / f"teacher-{teacher_games}"
    if not teacher.exists():
        env_args = json.dumps({"num_examples": teacher_games, "seed": 1})  # eval games use seed 0
        palaestra("eval", "tictactoe", "-m", TEACHER, "-a", env_args, "-n", teacher_games, "-r", 1,
                  "--save-dataset", teacher, "--quiet", "-o", args.workdir / "outputs")  # fmt: skip
    kept = keep_wins_and_draws(teacher)

    config = HERE / f"{args.model}.toml"
    extra = ["--lora.enabled=true", "--optim.lr=1e-3"] if args.lora else []
    palaestra("train", "sft", config, "--data.path", kept, "--output.dir", work / "sft", "--quiet",
              *extra, *args.overrides)  # fmt: skip

    models = {"after SFT": work / "sft" / "final"}
    if args.baseline:
        before = work / "sft" / "base-model" if args.model == "tiny" else "smollm2"
        models = {"before SFT": before, **models}
    rows = []
    for label, model in models.items():
        for opponent in ("random", "optimal"):
            summary = evaluate(model, opponent, args.games, args.workdir / "outputs")
            rows.append((label, opponent, summary))
    print_table(name, rows)


def palaestra(*argv: object) -> str:
    """Run one ``palaestra`` command in this Python; print it, its time and the load; return stdout."""
    command = [sys.executable, "-m", "palaestra.cli", *map(str, argv)]
    print("\n$ palaestra " + shlex.join(command[3:]), flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    print(done.stdout, end="")
    if done.returncode:
        raise SystemExit(f"failed with exit status {done.returncode}")
    print(f"[{time.perf_counter() - start:.0f} s; {os.popen('uptime').read().strip()}]", flush=True)
    return done.stdout


def keep_wins_and_draws(teacher: Path) -> Path:
    """TEMPORARY, until ``palaestra data filter`` exists: keep the teacher's won and drawn games
    that have a perfect format and no invalid move."""
    import datasets

    kept = teacher.with_name(teacher.name + "-won-drew")
    if not kept.exists():
        rows = datasets.load_from_disk(str(teacher))
        good = rows.filter(lambda r: (r["won"] == 1 or r["drew"] == 1) and r["format_reward"] == 1
                           and r["invalid_moves"] == 0 and not r["error"])  # fmt: skip
        good.save_to_disk(str(kept))
        print(f"kept {len(good)} of {len(rows)} teacher games (wins and draws): {kept}")
    return kept


def evaluate(model: Path | str, opponent: str, games: int, output_dir: Path) -> dict[str, float]:
    """The protocol's evaluation against ``opponent``; the summary's means by metric name."""
    out = palaestra("eval", "tictactoe", "-m", model, "-a", json.dumps({"opponent": opponent}), "-n", games,
                    "-r", 1, "-t", 64, "-c", games, "--quiet", "-o", output_dir)  # fmt: skip
    saved = next(line.removeprefix("saved: ") for line in out.splitlines() if line.startswith("saved: "))
    metadata = json.loads((Path(saved.strip()) / "metadata.json").read_text())
    return {name: value["mean"] for name, value in metadata["summary"]["metrics"].items()}


def print_table(name: str, rows: list[tuple[str, str, dict[str, float]]]) -> None:
    print(f"\n{name}: W/D/L (and unfinished) in % of games; legal replies = 1 - invalid moves / replies")
    print(
        "| model | opponent | W / D / L / unfinished | format | legal replies | games with an invalid move |"
    )
    print("|---|---|---|---|---|---|")
    for label, opponent, m in rows:
        wdl = " / ".join(f"{100 * m[k]:.0f}" for k in ("won", "drew", "lost", "unfinished"))
        legal = 1 - m["invalid_moves"] / m["turns"]
        print(
            f"| {label} | {opponent} | {wdl} | {m['format_reward']:.2f} | {legal:.0%} | {m['had_invalid_move']:.0%} |"
        )


if __name__ == "__main__":
    main()
