"""Asynchronous RL steps: ``train.max_off_policy_steps = 1`` against 0, on the same run, measured side by side.

    .venv/bin/python benchmarks/rl_async.py [--steps 24] [--skip-local]

A small tic-tac-toe run: a tiny Llama (0.13M parameters, ``examples/tictactoe/tiny.toml``) warmed
up by ``--sft-steps`` SFT steps on the heuristic teacher's won and drawn games, then RL by
``examples/tictactoe/tiny-rl.toml`` (CISPO, 128 games a step in groups of 8, whole games,
temperature 1) for ``--steps`` steps, from the same SFT checkpoint and seed, three ways:

- ``local``: the in-process sampler (the trained module itself), on-policy;
- ``remote k=0``: ``palaestra serve --enable-weight-sync`` in a process of its own, on-policy, the
  weights reloaded from disk after every step;
- ``remote k=1``: the same server, with the next step's games played while this step trains.

Every process runs on one thread (the trainer's ``train.threads = 1``, the server's
``OMP_NUM_THREADS=1``), so what k = 1 gains is the overlap of the server's sampling with the
trainer's update on a second core. Reported: each run's wall time (the whole ``train_rl`` call,
server start included; and its steps alone), k=1 ÷ k=0, the held-out reward (256 games of the
mixed opponent, seed 1000, cut at 3 replies) before and after, and the mean staleness and mismatch of k=1's batches.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HELD_OUT = {"num_examples": 256, "seed": 1000, "min_random_move_prob": 0.3, "max_turns": 3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="RL steps per run")
    parser.add_argument("--teacher-games", type=int, default=600)
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--skip-local", action="store_true", help="only the two remote runs")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="rl-async-"))
    print(f"work: {work}\nuptime: {uptime()}", flush=True)
    sft = sft_model(work, args.teacher_games, args.sft_steps)
    runs: list[tuple[str, dict[str, Any]]] = []
    if not args.skip_local:
        runs.append(("local", {}))
    runs += [("remote k=0", remote(0)), ("remote k=1", remote(1))]
    results = []
    for name, overrides in runs:
        results.append(
            rl_run(name, sft, work / name.replace(" ", "-").replace("=", ""), args.steps, overrides)
        )
        print(json.dumps(results[-1]), flush=True)
    print(f"uptime: {uptime()}", flush=True)
    report(results)


def uptime() -> str:
    return os.popen("uptime").read().strip()


def sft_model(work: Path, games: int, steps: int) -> Path:
    """The SFT start: ``steps`` steps on the won and drawn games of ``games`` heuristic-player games."""
    import tictactoe  # the bundled environment's package (installed by ./dev setup)

    import palaestra as pa
    from palaestra.data.rollouts import save_dataset
    from palaestra.train import SFTConfig, load_config, train_sft

    env = pa.load_environment("tictactoe", num_examples=games, seed=1)
    played = asyncio.run(env.run(pa.ScriptedClient(tictactoe.heuristic_player), pa.RunSpec()))
    kept = [g for g in played if (g.metrics["won"] or g.metrics["drew"]) and not g.metrics["invalid_moves"]]
    save_dataset(kept, work / "teacher")
    config = load_config(
        SFTConfig,
        ROOT / "examples" / "tictactoe" / "tiny.toml",
        {"data.path": str(work / "teacher"), "output.dir": str(work / "sft"), "train.steps": str(steps)},
    )
    t0 = time.perf_counter()
    train_sft(config, progress=False)
    print(f"sft: {len(kept)} games kept of {games}, {time.perf_counter() - t0:.0f} s", flush=True)
    return work / "sft" / "final"


def remote(ahead: int) -> dict[str, Any]:
    """The overrides of a run sampled by ``palaestra serve`` on a free port, ``ahead`` steps off-policy."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = (
        f"OMP_NUM_THREADS=1 {sys.executable} -m palaestra.cli serve {{weights_dir}} --port {port} "
        "--enable-weight-sync --max-batch-size 128"
    )
    return {
        "sampler.kind": '"vllm"',
        "sampler.url": f'"http://127.0.0.1:{port}/v1"',
        "sampler.command": json.dumps(command),
        "train.max_off_policy_steps": str(ahead),
    }


def rl_run(name: str, model: Path, out: Path, steps: int, overrides: dict[str, Any]) -> dict[str, Any]:
    from palaestra.train import load_config
    from palaestra.train.rl import train_rl
    from palaestra.train.rl_config import RLConfig

    held_out = "{" + ", ".join(f"{k} = {v}" for k, v in HELD_OUT.items()) + "}"
    base = {
        "model.path": str(model),
        "output.dir": str(out),
        "train.steps": str(steps),
        "train.threads": "1",
        "eval.every": "0",
        "eval.num_examples": "256",
        "output.sample_every": "0",
        "output.save_every": "0",
        "eval.sets": f"[{{name = 'held-out', args = {held_out}}}]",
    }
    config = load_config(RLConfig, ROOT / "examples" / "tictactoe" / "tiny-rl.toml", {**base, **overrides})
    t0 = time.perf_counter()
    train_rl(config, progress=False)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if r["step"] > 0]
    return {
        "run": name,
        "wall_s": round(wall, 1),
        "steps_s": round(sum(r["seconds"] for r in trained), 1),
        "sampling_s": round(sum(r["seconds_sampling"] for r in trained), 1),
        "training_s": round(sum(r["seconds_training"] for r in trained), 1),
        "waiting_s": round(sum(r.get("seconds_waiting", 0.0) for r in trained), 1),
        "sync_s": round(sum(r.get("seconds_sync", 0.0) for r in trained), 1),
        "held_out_before": records[0]["eval/held-out/reward"],
        "held_out_after": records[-1]["eval/held-out/reward"],
        "won_after": records[-1]["eval/held-out/won"],
        "train_reward_last4": statistics.mean(r["reward"] for r in trained[-4:]),
        "off_policy_mean": statistics.mean(r.get("off_policy_steps", 0) for r in trained),
        "mismatch_kl_mean": statistics.mean(r.get("mismatch/kl", 0.0) for r in trained),
        "mismatch_log_ratio_max": max(r.get("mismatch/log_ratio_max", 0.0) for r in trained),
    }


def report(results: list[dict[str, Any]]) -> None:
    by_name = {r["run"]: r for r in results}
    print(
        "\n| run | wall s | steps s | sampling s | training s | waiting s | sync s | held-out before → after "
        "| won after | off-policy (mean) | mismatch KL (mean) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['run']} | {r['wall_s']} | {r['steps_s']} | {r['sampling_s']} | {r['training_s']} | "
            f"{r['waiting_s']} | {r['sync_s']} | {r['held_out_before']:.3f} → {r['held_out_after']:.3f} | "
            f"{r['won_after']:.3f} | {r['off_policy_mean']:.2f} | {r['mismatch_kl_mean']:.2e} |"
        )
    k0, k1 = by_name["remote k=0"], by_name["remote k=1"]
    print(
        f"\nk=1 ÷ k=0 wall time: {k1['wall_s'] / k0['wall_s']:.2f}× (steps alone: "
        f"{k1['steps_s'] / k0['steps_s']:.2f}×); held-out reward after: k=0 {k0['held_out_after']:.3f}, "
        f"k=1 {k1['held_out_after']:.3f}"
    )
    if "local" in by_name:
        local = by_name["local"]
        print(
            f"remote k=0 ÷ local wall time: {k0['wall_s'] / local['wall_s']:.2f}× "
            f"(steps alone: {k0['steps_s'] / local['steps_s']:.2f}×)"
        )


if __name__ == "__main__":
    main()
