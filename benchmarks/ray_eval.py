"""Rollouts/s of one tic-tac-toe eval on this process's engine and on 1, 2 and 4 Ray workers.

The same run each time: ``--rollouts`` tic-tac-toe games (default 20,000: 10,000 examples × 2)
against the fake OpenAI-compatible server (``python -m palaestra.testing.server``, its own
process), ``-c 64`` requests in flight in all, saved to a run folder as ``palaestra eval`` saves
it. The Ray runs share one local cluster, started once (its start is reported apart); each run's
time includes starting its workers. Run it with ``OMP_NUM_THREADS=1`` on an otherwise idle
machine, and say how many cores it has: on 2 cores the fake server, the driver and the workers
share them.

Besides wall time, each row has the CPU time of the palaestra processes (the driver, and the
workers, read from ``/proc`` as their rollouts come back): the Ray path's CPU per rollout minus
the one-process engine's is its overhead per rollout (each group's trip to and from a worker,
its rollouts serialised on the way back, the actor calls), whatever the cores lent to it.

Usage: OMP_NUM_THREADS=1 python benchmarks/ray_eval.py [--rollouts 20000] [--workers 1 2 4]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import palaestra as pa
from palaestra.cli.common import ClientOptions
from palaestra.eval.ray_executor import RayExecutor
from palaestra.runner import run_async


def start_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "palaestra.testing.server", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "READY":
        proc.kill()
        raise RuntimeError(f"the fake server did not start: {line}")
    return proc, line[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(base_url: str, rollouts: int, executor: Any) -> tuple[float, float, float, pa.EvalRun]:
    """(wall seconds, this process's CPU seconds, the workers' CPU seconds, the run) of one eval."""
    workers: dict[int, float] = {}
    done = 0

    def on_rollout(_: pa.Rollout) -> None:  # the workers' CPU, read while they are alive
        nonlocal done
        done += 1
        if executor is not None and (done % 500 == 0 or done == rollouts):
            for pid in executor.stats.pids:
                try:
                    workers[pid] = cpu_seconds(pid)
                except OSError:  # a worker that is gone keeps its last reading
                    pass

    async def go() -> pa.EvalRun:
        env = pa.load_environment("tictactoe", num_examples=rollouts // 2)
        client = pa.OpenAIClient("fake-model", base_url=base_url, api_key="", max_connections=64)
        spec = pa.RunSpec(num_examples=rollouts // 2, rollouts_per_example=2, max_concurrent=64, seed=0)
        with tempfile.TemporaryDirectory() as out:
            try:
                return await pa.evaluate(
                    env,
                    client,
                    spec,
                    output_dir=out,
                    env_id="tictactoe",
                    executor=executor,
                    on_rollout=on_rollout,
                )
            finally:
                await client.aclose()

    cpu0, wall0 = time.process_time(), time.perf_counter()
    run = run_async(go())
    return time.perf_counter() - wall0, time.process_time() - cpu0, sum(workers.values()), run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=20_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    import ray

    proc, url = start_server()
    rows = []
    try:
        server0 = cpu_seconds(proc.pid)
        wall, cpu, _, run = measure(url, args.rollouts, None)
        server_ms = 1000 * (cpu_seconds(proc.pid) - server0) / args.rollouts
        summary = {k: v for k, v in run.summary.items() if k != "timing"}
        calls = sum(len(r.turns) for r in run.rollouts)  # model calls
        rows.append(("one process (engine)", wall, cpu, 0.0))
        t0 = time.perf_counter()
        ray.init(
            num_cpus=max(args.workers),
            include_dashboard=False,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )
        cluster_start = time.perf_counter() - t0
        options = ClientOptions("fake-model", base_url=url, no_api_key=True)
        for n in args.workers:
            executor = RayExecutor("tictactoe", {"num_examples": args.rollouts // 2}, options, workers=n)
            wall, cpu, workers, run = measure(url, args.rollouts, executor)
            same = {k: v for k, v in run.summary.items() if k != "timing"} == summary
            name = f"Ray, {n} worker{'s' * (n > 1)}{'' if same else ' (summary DIFFERS)'}"
            rows.append((name, wall, cpu, workers))
        ray.shutdown()
    finally:
        proc.terminate()
        proc.wait(10)
    print(
        f"{args.rollouts:,} tic-tac-toe rollouts, {calls / args.rollouts:.1f} model calls each, "
        f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; Ray cluster start "
        f"{cluster_start:.1f} s (not in the rows); the fake server's CPU: {server_ms:.2f} ms per rollout"
    )
    print("| executor | wall s | rollouts/s | driver CPU s | workers' CPU s | palaestra CPU ms / rollout |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, wall, cpu, workers in rows:
        per = 1000 * (cpu + workers) / args.rollouts
        print(
            f"| {name} | {wall:.1f} | {args.rollouts / wall:,.0f} | {cpu:.1f} | {workers:.1f} | {per:.2f} |"
        )
    base = 1000 * (rows[0][2] + rows[0][3]) / args.rollouts
    for name, _, cpu, workers in rows[1:]:
        print(
            f"{name}: {1000 * (cpu + workers) / args.rollouts - base:+.2f} ms CPU per rollout vs one process"
        )


if __name__ == "__main__":
    main()
