"""How much of a run is saved when it is killed part-way: groups started a bounded number at a time
(the engine) against all groups started at once (the engine before, as the reference).

A tic-tac-toe eval of 400 examples × 3 rollouts with a scripted player that takes 20 ms per
model call, at 32 requests in flight: each run is timed whole, then run again and cancelled at
40% of that time; the rollouts saved by then are counted. Cancelling is what Ctrl-C, SIGTERM or a
dying server do to a run.

Usage: python benchmarks/saved_progress.py [--examples 400] [--at 0.4]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import tictactoe

import palaestra as pa
import palaestra.engine as engine


async def latency_player(messages: pa.Messages, rng: object) -> str:
    await asyncio.sleep(0.02)  # a model call
    return tictactoe.heuristic_player(messages, rng)


async def run(examples: int, cut: float | None, bounded: bool) -> tuple[float, int]:
    """(seconds, rollouts saved) of one run, cancelled after ``cut`` seconds if given."""
    original = engine.groups_in_flight
    if not bounded:
        engine.groups_in_flight = lambda spec: examples  # every group at once
    env = pa.load_environment("tictactoe", num_examples=examples)
    spec = pa.RunSpec(rollouts_per_example=3, max_concurrent=32)
    out = Path(tempfile.mkdtemp())
    start = time.perf_counter()
    client = pa.ScriptedClient(latency_player, model="player")
    task = asyncio.create_task(pa.evaluate(env, client, spec, output_dir=out, env_id="tictactoe"))
    try:
        if cut is None:
            await task
        else:
            await asyncio.sleep(cut)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        engine.groups_in_flight = original
    (results,) = out.glob("evals/*/*/results.jsonl")
    return time.perf_counter() - start, len(results.read_text().splitlines())


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--at", type=float, default=0.4, help="kill at this share of the full run")
    args = parser.parse_args()
    total = args.examples * 3
    for bounded in (False, True):
        whole, _ = await run(args.examples, None, bounded)
        _, saved = await run(args.examples, args.at * whole, bounded)
        name = "bounded groups (palaestra)" if bounded else "all groups at once (reference)"
        print(
            f"{name:32} whole run {whole:5.1f} s · killed at {args.at:.0%}: "
            f"{saved}/{total} rollouts saved ({saved / total:.0%})"
        )


if __name__ == "__main__":
    asyncio.run(main())
