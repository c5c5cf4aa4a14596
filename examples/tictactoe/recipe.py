"""The tic-tac-toe recipe end to end: teacher data, filter, SFT, RL, evaluation, a before/after table.

    python examples/tictactoe/recipe.py demo                 # the talk in miniature (./dev demo)
    python examples/tictactoe/recipe.py tiny --rl            # the tiny model's full recipe
    python examples/tictactoe/recipe.py smollm2 --games 20   # SmolLM2-135M-Instruct, full fine-tuning
    python examples/tictactoe/recipe.py smollm2 --games 20 --lora

Every stage is a ``palaestra`` command (printed before it runs, with its wall-clock time and the
machine's load after it), so each can be rerun by hand. Evaluation follows the environment's
protocol: games against the random and the optimal opponent, one rollout each, the
environment's own sampling (temperature 1), replies capped at 64 tokens. ``demo`` is the tiny
recipe with every stage: the model before SFT, after SFT and after RL.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
TEACHER = "scripted:tictactoe:heuristic_player"
KEEP = ["won == 1 or drew == 1", "format_reward == 1", "invalid_moves == 0"]  # the teacher games to imitate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["demo", "tiny", "smollm2"])
    parser.add_argument("--games", type=int, default=None, help="evaluation games per opponent")
    parser.add_argument("--teacher-games", type=int, default=None, help="default: 2000 tiny, 300 smollm2")
    parser.add_argument("--lora", action="store_true", help="LoRA instead of full fine-tuning (smollm2)")
    parser.add_argument("--baseline", action="store_true", help="also evaluate the model before SFT")
    parser.add_argument("--rl", action="store_true", help="then train with RL from the SFT checkpoint")
    parser.add_argument("--workdir", type=Path, default=Path("outputs/tictactoe"))
    parser.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE",
                        help="an SFT config override, e.g. --sft-set train.steps=40 (repeatable)")  # fmt: skip
    parser.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE",
                        help="an RL config override, e.g. --rl-set optim.lr=3e-4 (repeatable)")  # fmt: skip
    args = parser.parse_args()
    demo = args.model == "demo"
    model = "tiny" if demo else args.model
    name = args.model + ("-lora" if args.lora else "")
    work = args.workdir / name
    if demo and work.exists():  # the demo's own folder: each run starts from nothing
        print(f"removing the previous demo run {work}")
        shutil.rmtree(work)
    games = args.games or 100
    teacher_games = args.teacher_games or (2000 if model == "tiny" else 300)
    times: dict[str, float] = {}

    start = time.perf_counter()
    teacher = args.workdir / f"teacher-{teacher_games}-won-drew"
    if not teacher.exists():
        env_args = json.dumps({"num_examples": teacher_games, "seed": 1})  # evaluation games use seed 0
        out = palaestra("eval", "tictactoe", "-m", TEACHER, "-a", env_args, "-n", teacher_games, "-r", 1,
                        "--quiet", "-o", args.workdir / "outputs", echo=False)  # fmt: skip
        where = [a for condition in KEEP for a in ("-w", condition)]
        palaestra("data", "filter", saved_run(out), *where, "-o", teacher)
    times["teacher data"] = time.perf_counter() - start

    start = time.perf_counter()
    extra = ["--lora.enabled=true", "--optim.lr=1e-3"] if args.lora else []
    palaestra("train", "sft", HERE / f"{model}.toml", "--data.path", teacher, "--output.dir", work / "sft",
              "--quiet", *extra, *(f"--{o}" for o in args.sft_set))  # fmt: skip
    times["SFT"] = time.perf_counter() - start

    models: dict[str, Path | str] = {}
    if args.baseline or demo:
        models["before SFT"] = work / "sft" / "base-model" if model == "tiny" else "smollm2"
    models["after SFT"] = work / "sft" / "final"
    if args.rl or demo:
        start = time.perf_counter()
        palaestra("train", "rl", HERE / f"{model}-rl.toml", "--model.path", work / "sft" / "final",
                  "--output.dir", work / "rl", "--quiet", *(f"--{o}" for o in args.rl_set))  # fmt: skip
        times["RL"] = time.perf_counter() - start
        models["after RL"] = work / "rl" / "final"

    start = time.perf_counter()
    rows = []
    for label, path in models.items():
        for opponent in ("random", "optimal"):
            rows.append((label, opponent, evaluate(path, opponent, games, args.workdir / "outputs")))
    times["evaluation"] = time.perf_counter() - start
    print_table(name, rows, games)
    print("\ntime per stage: " + ", ".join(f"{stage} {seconds:.0f} s" for stage, seconds in times.items())
          + f"; total {sum(times.values()) / 60:.1f} min")  # fmt: skip
    if args.rl or demo:
        print(
            f"RL curves: {work / 'rl' / 'curves.html'}; read the games: palaestra report {work / 'rl' / 'samples'}/step-*"
        )


def palaestra(*argv: object, echo: bool = True) -> str:
    """Run one ``palaestra`` command in this Python; print it, its time and the load. ``echo``: its
    output goes straight to the terminal (returns ""); else only the saved run's path is printed,
    and its stdout is returned."""
    command = [sys.executable, "-m", "palaestra.cli", *map(str, argv)]
    print("\n$ palaestra " + shlex.join(command[3:]), flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, stdout=None if echo else subprocess.PIPE, text=True)
    out = done.stdout or ""
    print("".join(line for line in out.splitlines(keepends=True) if line.startswith("saved:")), end="")
    if done.returncode:
        raise SystemExit(f"failed with exit status {done.returncode}")
    print(f"[{time.perf_counter() - start:.0f} s; {os.popen('uptime').read().strip()}]", flush=True)
    return out


def saved_run(stdout: str) -> Path:
    """The run folder a ``palaestra eval`` printed (``saved: PATH``)."""
    return Path(
        next(
            line.removeprefix("saved: ") for line in stdout.splitlines() if line.startswith("saved: ")
        ).strip()
    )


def evaluate(model: Path | str, opponent: str, games: int, output_dir: Path) -> dict[str, float]:
    """The protocol's evaluation against ``opponent``; the summary's means by metric name."""
    out = palaestra("eval", "tictactoe", "-m", model, "-a", json.dumps({"opponent": opponent}), "-n", games,
                    "-r", 1, "-t", 64, "-c", games, "--quiet", "-o", output_dir, echo=False)  # fmt: skip
    metadata = json.loads((saved_run(out) / "metadata.json").read_text())
    return {name: value["mean"] for name, value in metadata["summary"]["metrics"].items()}


def print_table(name: str, rows: list[tuple[str, str, dict[str, float]]], games: int) -> None:
    print(f"\n{name}: {games} games per opponent; W/D/L/unfinished in % of games; "
          "legal replies = 1 - invalid moves / replies")  # fmt: skip
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
