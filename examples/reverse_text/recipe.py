"""Reverse text on the embedded SmolLM2-135M-Instruct: teacher data, filter, SFT, RL, a before/after table.

    python examples/reverse_text/recipe.py                # the whole recipe (resumable)
    python examples/reverse_text/recipe.py --lora         # the same with LoRA adapters

The talk's first environment, on a real pretrained model. The paragraphs are one sentence of three
to six words (``sentences = [1, 1], words = [3, 6]``: about 30 characters, some 15 of SmolLM2's
tokens reversed), so that SFT and RL of a 135M-parameter model fit in two hours on two CPU
cores. Every stage is a ``palaestra`` command (``palaestra.recipes``), printed with its time;
run the same command again after an interruption and it skips the finished stages and resumes an
interrupted training run from its last checkpoint.

1. teacher data: the environment's scripted ``noisy_reverser`` on dataset seed 1, kept where its
   reversal is exact (``palaestra data filter -w "lcs_reward == 1"``);
2. SFT of SmolLM2 on those replies (``sft.toml``), both cores data-parallel;
3. RL from the SFT model (``rl.toml``): CISPO, groups of 8 replies at temperature 1, the LCS
   reward; its held-out set is evaluated before its first step and after its last;
4. the untrained model on the same held-out set (first, before SFT).

Evaluation: 200 held-out paragraphs (dataset seed 0, which no training stage sees: the teacher
uses seed 1, RL seed 2), one reply each at temperature 1 (the sampling RL trains with), the mean
LCS reward with its 95% t interval, and each change with the paired 95% interval over the same
paragraphs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from palaestra.eval.stats import Mean, paired_change
from palaestra.recipes import held_out, palaestra, rewards, saved_run, summary, train

HERE = Path(__file__).parent
LENGTHS = {"sentences": [1, 1], "words": [3, 6]}
HELD_OUT = {"num_examples": 200, "seed": 0, **LENGTHS}  # the [eval] set of rl.toml
TEACHER_GAMES = 6000  # about 35% are exact: ~2,100 replies to learn from
MAX_TOKENS = 48  # per reply, as rl.toml: the longest exact reversal with its tags is ~35 tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lora", action="store_true", help="LoRA adapters instead of full fine-tuning")
    parser.add_argument("--nproc", type=int, default=None, help="training processes (default: 2, one a core)")
    parser.add_argument("--workdir", type=Path, default=Path("outputs/reverse_text"))
    args = parser.parse_args()
    work = args.workdir / ("smollm2-lora" if args.lora else "smollm2")
    nproc = args.nproc or max(1, min(2, os.cpu_count() or 1))
    times: dict[str, float] = {}

    start = time.perf_counter()
    teacher = args.workdir / f"teacher-{TEACHER_GAMES}-exact"
    if not teacher.exists():
        out = palaestra(
            "eval",
            "reverse_text",
            "-m",
            "scripted:reverse_text:noisy_reverser",
            "-a",
            json.dumps({"num_examples": TEACHER_GAMES, "seed": 1, **LENGTHS}),
            "-n",
            TEACHER_GAMES,
            "-r",
            1,
            "--quiet",
            "-o",
            args.workdir / "teacher",
            echo=False,
        )
        palaestra("data", "filter", saved_run(out), "-w", "lcs_reward == 1", "-o", teacher)
    times["teacher data"] = time.perf_counter() - start

    start = time.perf_counter()
    before = args.workdir / "before-sft"  # the untrained model on the held-out set
    if not (before / "metadata.json").exists():
        out = palaestra(
            "eval",
            "reverse_text",
            "-m",
            "smollm2",
            "-a",
            json.dumps(HELD_OUT),
            "-n",
            HELD_OUT["num_examples"],
            "-r",
            1,
            "-t",
            MAX_TOKENS,
            "-c",
            HELD_OUT["num_examples"],
            "--quiet",
            "-o",
            args.workdir / "evals",
            echo=False,
        )
        saved_run(out).rename(before)
    times["untrained model"] = time.perf_counter() - start

    start = time.perf_counter()
    lora = ("--lora.enabled", "true", "--optim.lr", "2e-3") if args.lora else ()
    train("sft", HERE / "sft.toml", work / "sft", "--data.path", teacher, *lora, nproc=nproc)
    times["SFT"] = time.perf_counter() - start
    start = time.perf_counter()
    rl_lora = ("--lora.enabled", "true", "--optim.lr", "2e-4") if args.lora else ()
    train("rl", HERE / "rl.toml", work / "rl", "--model.path", work / "sft" / "final", *rl_lora, nproc=nproc)
    times["RL"] = time.perf_counter() - start
    runs = {
        "before SFT": before,
        "after SFT": held_out(work / "rl", "held_out", first=True),
        "after RL": held_out(work / "rl", "held_out", first=False),
    }
    print_table(work.name, runs)
    print(
        "\ntime per stage: "
        + ", ".join(f"{stage} {seconds:.0f} s" for stage, seconds in times.items())
        + f"; total {sum(times.values()) / 60:.1f} min"
    )


def print_table(name: str, runs: dict[str, Path]) -> None:
    values = {label: rewards(saved) for label, saved in runs.items()}
    print(
        f"\n{name}: {HELD_OUT['num_examples']} held-out paragraphs, one reply each at temperature 1; "
        "mean LCS reward [95% t interval]"
    )
    print("| model | LCS reward | exact reversals | format |")
    print("|---|---|---|---|")
    for label, saved in runs.items():
        scores = values[label]
        exact = sum(v == 1.0 for v in scores)
        fmt = summary(saved).get("format_reward", float("nan"))
        print(f"| {label} | {Mean(tuple(scores))} | {exact} of {len(scores)} | {fmt:.0%} |")
    for after, before in (("after RL", "after SFT"), ("after SFT", "before SFT"), ("after RL", "before SFT")):
        print(f"- {after} vs {before}: {paired_change(values[after], values[before])}")


if __name__ == "__main__":
    main()
