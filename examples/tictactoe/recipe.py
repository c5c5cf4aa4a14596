"""The tic-tac-toe recipe end to end: teacher data, filter, SFT, RL, evaluation, a before/after table.

    python examples/tictactoe/recipe.py demo                 # the talk in miniature (./dev demo)
    python examples/tictactoe/recipe.py tiny                 # the full run of the tiny model (resumable)
    python examples/tictactoe/recipe.py smollm2              # SmolLM2-135M-Instruct: teacher data, SFT, eval
    python examples/tictactoe/recipe.py smollm2 --rl         # ... then RL (LoRA; the long run is a GPU's)

Every stage is a ``palaestra`` command (printed before it runs, with its wall-clock time and the
machine's load after it; ``palaestra.recipes``), so each can be rerun by hand. ``tiny`` and ``smollm2`` keep what they
have done: run the same command again after an interruption and it skips the finished stages and
resumes an interrupted training run from its last checkpoint. ``demo`` starts from nothing.

Evaluation is the environment's protocol: whole games against the random and against the optimal
opponent, one rollout each, the environment's own sampling (temperature 1), every model on the
same games (dataset seed 0; the teacher's games use seed 1 and RL's seed 5). The RL runs'
held-out sets are these very games, so their curves end at the table's numbers, and the table's
"after SFT" and "after RL" rows are read from them (the first run's evaluation before its first
step, the last run's after its last) instead of being played a second time. The models that
need no training (the teacher, the model before SFT) are evaluated while SFT and RL train. The table
gives 95% intervals (Wilson) for the headline rates and for each change (Newcombe).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from palaestra.eval.stats import Rate, change
from palaestra.recipes import held_out, palaestra, saved_run, summary, train

HERE = Path(__file__).parent
TEACHER = "scripted:tictactoe:teacher_player"  # names the optimal cells; plays at random 20% of the time
# its games for SFT: the same teacher with a deliberate invalid move (a taken cell) in ~1 game in 3,
# then its reply to the rejection; the mistake is kept as context with weight 0 (MASK), so the
# student learns to answer "Invalid move: ..." with a free cell, which games without one never show
DATA_TEACHER = "scripted:tictactoe:recovering_teacher_player"
KEEP = ["won == 1 or drew == 1", "format_reward == 1"]  # the teacher games to imitate
MASK = "^Invalid move"  # the replies the environment rejected: context, not trained
# the demo's data as it was measured: the teacher's own games, those without an invalid move
PLAIN = ("scripted:tictactoe:teacher_player", [*KEEP, "invalid_moves == 0"], None)


@dataclass(frozen=True)
class Plan:
    """What one recipe runs: how many teacher games, which configs, how many protocol games."""

    teacher_games: int
    sft: str  # config file in this folder
    rl: list[str]  # RL stages, each from the previous one's final checkpoint
    games: int  # protocol games per opponent
    # per reply, in evaluation (the RL configs sample with the same cap); above the teacher's
    # longest reply (50 tokens of the tiny model's, with its end), or the student is taught
    # replies that the cap cuts
    max_tokens: int
    sft_args: tuple[str, ...] = ()
    rl_args: tuple[str, ...] = ()  # every RL stage's overrides
    stage_args: tuple[tuple[str, ...], ...] = ()  # each RL stage's own, after rl_args (one per stage)
    nproc: int = 1  # training processes (data-parallel, ``--nproc``), at most one per core
    # the teacher data: the scripted teacher, the filter's conditions, the replies masked (regex)
    data: tuple[str, list[str], str | None] = (DATA_TEACHER, KEEP, MASK)

    def __post_init__(self) -> None:
        if self.stage_args and len(self.stage_args) != len(self.rl):
            raise ValueError(f"stage_args has {len(self.stage_args)} entries for {len(self.rl)} RL stages")


def env_args(config: str, **changes: object) -> str:
    """``--env.args`` for the environment arguments of ``config`` (in this folder) with ``changes``."""
    with open(HERE / config, "rb") as f:
        args = tomllib.load(f)["env"]["args"] | changes
    return "{" + ", ".join(f"{key} = {json.dumps(value)}" for key, value in args.items()) + "}"


PLANS = {
    "demo": Plan(
        8000,
        "tiny.toml",
        ["tiny-rl.toml"],
        200,
        64,
        sft_args=("--train.steps", "600"),
        # one stage of 120 steps of 128 games at the full run's lr 1e-3, constant, against
        # opponents of randomness 0-0.5: every window student measured gained draws there; on
        # 0-0.75 one lost its draws, and two stages (0-0.25 or the optimal player, then 0-1) gave
        # back in the second what the first had gained (README: the demo)
        rl_args=(
            "--train.steps",
            "120",
            "--output.save_every",
            "120",
            "--train.batch_size",
            "128",
            "--train.max_concurrent",
            "128",
            "--optim.lr",
            "1e-3",
            "--optim.schedule",
            "constant",
            "--eval.every",
            "0",
            "--env.args",
            env_args("tiny-rl.toml", max_random_move_prob=0.5),
        ),
        # both cores: SFT and RL data-parallel over two processes, the one-process step (same games)
        nproc=2,
        # the plain teacher games: on the recovering teacher's, 600 SFT steps gave a weaker student
        # (71% legal replies, 17% draws) and the demo took 14 minutes (README: the demo)
        data=PLAIN,
    ),
    "tiny": Plan(30000, "tiny.toml", ["tiny-rl.toml"], 200, 64, nproc=2),
    "smollm2": Plan(600, "smollm2.toml", ["smollm2-rl.toml"], 200, 64, data=PLAIN),  # as measured
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", choices=list(PLANS))
    parser.add_argument("--games", type=int, default=None, help="protocol games per opponent")
    parser.add_argument("--teacher-games", type=int, default=None)
    parser.add_argument("--lora", action="store_true", help="LoRA instead of full fine-tuning (smollm2)")
    parser.add_argument("--rl", action="store_true", help="smollm2: also train with RL")
    parser.add_argument("--no-baseline", action="store_true", help="skip evaluating the model before SFT")
    parser.add_argument("--nproc", type=int, default=None, help="training processes (default: the recipe's)")
    parser.add_argument("--workdir", type=Path, default=Path("outputs/tictactoe"))
    parser.add_argument(
        "--sft-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an SFT config override, e.g. --sft-set train.steps=40 (repeatable)",
    )
    parser.add_argument(
        "--rl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an RL config override, e.g. --rl-set optim.lr=3e-4 (repeatable)",
    )
    args = parser.parse_args()
    plan = PLANS[args.recipe]
    name = args.recipe + ("-lora" if args.lora else "")
    work = args.workdir / name
    if args.recipe == "demo" and work.exists():  # the demo's own folder: each run starts from nothing
        print(f"removing the previous demo run {work}")
        shutil.rmtree(work)
    games = args.games or plan.games
    teacher_games = args.teacher_games or plan.teacher_games
    evals = args.workdir / "evals"
    times: dict[str, float] = {}
    nproc = args.nproc or max(1, min(plan.nproc, os.cpu_count() or 1))

    start = time.perf_counter()
    data_teacher, keep, mask = plan.data
    kind = "-recovering" if mask else ""
    teacher = args.workdir / f"teacher-{teacher_games}{kind}-won-drew"
    if not teacher.exists():
        env_args = json.dumps({"num_examples": teacher_games, "seed": 1})  # evaluation games use seed 0
        out = palaestra(
            "eval",
            "tictactoe",
            "-m",
            data_teacher,
            "-a",
            env_args,
            "-n",
            teacher_games,
            "-r",
            1,
            "--quiet",
            "-o",
            args.workdir / "teacher",
            echo=False,
        )
        where = [a for condition in keep for a in ("-w", condition)]
        masked = ("--mask-rejected", mask) if mask else ()
        palaestra("data", "filter", saved_run(out), *where, *masked, "-o", teacher)
    times["teacher data"] = time.perf_counter() - start

    models: dict[str, Path | str] = {"teacher": TEACHER}
    if not args.no_baseline:
        models["before SFT"] = work / "sft" / "base-model" if args.recipe != "smollm2" else "smollm2"
    sft_over, failed = threading.Event(), threading.Event()

    def evaluate_untrained() -> dict[str, dict[str, dict[str, float]]]:
        """The models that need no training, in one more process beside SFT and RL: from the moment
        the SFT run has saved its base model (its first metrics line is written after it)."""
        while not (work / "sft" / "metrics.jsonl").exists() and not sft_over.is_set():
            time.sleep(1)
        done = {}
        for label, model in models.items():
            if failed.is_set():  # a stage failed: the recipe stops, so do these
                break
            done[label] = evaluate_both(model, games, plan.max_tokens, evals)
        return done

    start = time.perf_counter()
    extra = ["--lora.enabled=true", "--optim.lr=1e-3"] if args.lora else []
    with ThreadPoolExecutor(1) as pool:
        untrained = pool.submit(evaluate_untrained)
        try:
            train(
                "sft",
                HERE / plan.sft,
                work / "sft",
                "--data.path",
                teacher,
                *plan.sft_args,
                *extra,
                *(f"--{o}" for o in args.sft_set),
                nproc=nproc,
            )
        except BaseException:
            failed.set()
            raise
        finally:
            sft_over.set()
        times["SFT"] = time.perf_counter() - start
        start = time.perf_counter()
        results: dict[str, dict[str, dict[str, float]]] = {}
        if args.recipe != "smollm2" or args.rl:
            runs = []
            previous = work / "sft" / "final"
            for i, config in enumerate(plan.rl, 1):
                run = work / (f"rl-{i}" if len(plan.rl) > 1 else "rl")
                try:
                    train(
                        "rl",
                        HERE / config,
                        run,
                        "--model.path",
                        previous,
                        *plan.rl_args,
                        *(plan.stage_args[i - 1] if plan.stage_args else ()),
                        *(f"--{o}" for o in args.rl_set),
                        nproc=nproc,
                    )
                except BaseException:
                    failed.set()
                    raise
                runs.append(run)
                previous = run / "final"
            results["after SFT"] = held_out_both(runs[0], first=True)
            results["after RL"] = held_out_both(runs[-1], first=False)
            times["RL"] = time.perf_counter() - start
        else:
            results["after SFT"] = evaluate_both(work / "sft" / "final", games, plan.max_tokens, evals)
            times["evaluation"] = time.perf_counter() - start
        start = time.perf_counter()
        results = untrained.result() | results
        times["waiting for the other evaluations"] = time.perf_counter() - start
    print_table(name, results, games)
    print(
        "\ntime per stage: "
        + ", ".join(f"{stage} {seconds:.0f} s" for stage, seconds in times.items())
        + f"; total {sum(times.values()) / 60:.1f} min"
    )
    if "after RL" in results:
        rl_dirs = " ".join(str(p) for p in sorted(work.glob("rl*")))
        print(
            f"RL curves: palaestra train curves {rl_dirs}; read the games: palaestra report {work}/rl*/samples/step-*"
        )


def evaluate(
    model: Path | str, opponent: str, games: int, max_tokens: int, output_dir: Path
) -> dict[str, float]:
    """The protocol against ``opponent``: the summary's means by metric name, and ``n``."""
    env_args = json.dumps({"opponent": opponent, "num_examples": games})
    out = palaestra(
        "eval",
        "tictactoe",
        "-m",
        model,
        "-a",
        env_args,
        "-n",
        games,
        "-r",
        1,
        "-t",
        max_tokens,
        "-c",
        games,
        "--quiet",
        "-o",
        output_dir,
        echo=False,
    )
    return summary(saved_run(out))


def evaluate_both(
    model: Path | str, games: int, max_tokens: int, output_dir: Path
) -> dict[str, dict[str, float]]:
    return {
        opponent: evaluate(model, opponent, games, max_tokens, output_dir)
        for opponent in ("random", "optimal")
    }


def held_out_both(run: Path, *, first: bool) -> dict[str, dict[str, float]]:
    """An RL run's protocol evaluation before its first step or after its last, as ``evaluate``'s."""
    return {opponent: summary(held_out(run, opponent, first=first)) for opponent in ("random", "optimal")}


def rate(m: dict[str, float], key: str) -> Rate:
    return Rate(round(m[key] * m["n"]), int(m["n"]))


def print_table(name: str, results: dict[str, dict[str, dict[str, float]]], games: int) -> None:
    print(
        f"\n{name}: {games} games per opponent, whole games, temperature 1; W / D / L / unfinished in % "
        "of games; [95% intervals]; legal replies = 1 - invalid moves / replies"
    )
    print(
        "| model | vs random W / D / L / U | wins vs random | vs optimal W / D / L / U | draws vs optimal "
        "| legal replies | games with an invalid move |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, by in results.items():
        r, o = by["random"], by["optimal"]
        wdl = [" / ".join(f"{100 * m[k]:.0f}" for k in ("won", "drew", "lost", "unfinished")) for m in (r, o)]
        legal = 1 - (r["invalid_moves"] * r["n"] + o["invalid_moves"] * o["n"]) / (
            r["turns"] * r["n"] + o["turns"] * o["n"]
        )
        invalid = (r["had_invalid_move"] + o["had_invalid_move"]) / 2
        print(
            f"| {label} | {wdl[0]} | {rate(r, 'won')} | {wdl[1]} | {rate(o, 'drew')} | {legal:.1%} | {invalid:.1%} |"
        )
    pairs = [
        ("after RL", "after SFT"),
        ("after RL", "teacher"),
        ("after SFT", "before SFT"),
    ]
    for after, before in pairs:
        if after in results and before in results:
            a, b = results[after], results[before]
            print(
                f"- {after} vs {before}: draws vs optimal {change(rate(a['optimal'], 'drew'), rate(b['optimal'], 'drew'))}; "
                f"wins vs random {change(rate(a['random'], 'won'), rate(b['random'], 'won'))}"
            )


if __name__ == "__main__":
    main()
