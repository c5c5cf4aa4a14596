"""Engine throughput and client CPU per model call, against a zero-latency fake server.

The fake OpenAI-compatible server runs as a separate process, so the CPU measured here
(``time.process_time`` of this process) is the client's alone: engine, environment, scoring,
HTTP client and JSON, everything included. Workloads:

- ``reverse_text``: 2,000 single-turn rollouts of the bundled reverse_text environment;
- ``games``: 500 tic-tac-toe-like games (a multi-turn env with a board, a random opponent drawn
  from the rollout rng and ~4 model turns per game).

References measured in the same run, same server, same concurrency:
- ``floor``: a bare aiohttp session posting the same JSON and decoding the reply, nothing else;
- ``sdk``: the same palaestra workload through the official openai SDK transport.

Each case runs on the default asyncio event loop and on uvloop (which the CLI uses when it is
installed, as it is with palaestra on Linux and macOS).

Usage: python benchmarks/engine.py [--repeats 3] [--concurrency 64 256] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import aiohttp
import orjson

try:
    import uvloop
except ImportError:  # Windows: the default loop only
    uvloop = None

import palaestra as pa

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


class Games(pa.MultiTurnEnv):
    """Tic-tac-toe-like: the model's move is parsed; an invalid one takes the first free cell."""

    def __init__(self, n: int) -> None:
        rows = [{"question": "You play X. Reply <move>N</move>.\n0|1|2\n3|4|5\n6|7|8"} for _ in range(n)]
        parser = pa.XMLParser(["move"])

        def win(state: pa.State) -> float:
            return {"X": 1.0, "draw": 0.5}.get(state.get("winner", ""), 0.0)

        super().__init__(
            dataset=rows,
            parser=parser,
            rubric=pa.Rubric([win, parser.format_reward_func()], [1.0, 0.2]),
            max_turns=9,
        )

    async def setup_state(self, state: pa.State) -> None:
        state["board"] = [" "] * 9

    async def env_response(self, messages: pa.Messages, state: pa.State) -> pa.Messages | pa.Final:
        board = state["board"]
        free = [i for i, c in enumerate(board) if c == " "]
        move = self.parser.parse_answer(messages)
        cell = int(move) if move and move.isdigit() and int(move) in free else free[0]
        board[cell] = "X"
        if not _finished(board, state):
            free = [i for i, c in enumerate(board) if c == " "]
            board[state.rng.choice(free)] = "O"
        text = "\n".join(
            "|".join(board[r * 3 + c] if board[r * 3 + c] != " " else str(r * 3 + c) for c in range(3))
            for r in range(3)
        )
        reply = [{"role": "user", "content": f"Board:\n{text}\nYour move."}]
        return pa.Final(reply, reason="game_over") if _finished(board, state) else reply


def _finished(board: list[str], state: pa.State) -> bool:
    for a, b, c in LINES:
        if board[a] != " " and board[a] == board[b] == board[c]:
            state["winner"] = board[a]
            return True
    if " " not in board:
        state["winner"] = "draw"
        return True
    return False


def start_server(reply: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "palaestra.testing.server", "--port", "0", "--reply", reply],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"fake server did not start: {line!r}")
    return proc, line.split()[1]


Work = Callable[[], Awaitable[tuple[int, float]]]  # returns (model calls, seconds in reward functions)


async def measure(work: Work) -> tuple[float, float, int, float]:
    """(wall seconds, client CPU seconds, model calls, reward-function seconds) of one run."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    calls, scoring = await work()
    return time.perf_counter() - wall0, time.process_time() - cpu0, calls, scoring


def palaestra_run(
    env: pa.Environment, base_url: str, model: str, concurrency: int, transport: Literal["aiohttp", "openai"]
) -> Work:
    async def work() -> tuple[int, float]:
        async with pa.OpenAIClient(
            model, base_url=base_url, transport=transport, max_connections=concurrency
        ) as client:
            rollouts = await env.run(client, pa.RunSpec(max_concurrent=concurrency, seed=0))
        errors = [r.error for r in rollouts if r.error]
        if errors:
            raise RuntimeError(f"{len(errors)} rollouts failed, e.g. {errors[0]}")
        return sum(len(r.turns) for r in rollouts), sum(r.timing.scoring for r in rollouts)

    return work


def floor_run(base_url: str, model: str, concurrency: int, calls: int) -> Work:
    """A bare aiohttp session: post JSON, decode JSON. The least any client can spend."""

    async def work() -> tuple[int, float]:
        sem = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

            async def one(i: int) -> None:
                body = {"model": model, "messages": [{"role": "user", "content": f"text number {i}"}]}
                async with (
                    sem,
                    session.post(
                        f"{base_url}/chat/completions",
                        data=orjson.dumps(body),
                        headers={"Content-Type": "application/json"},
                    ) as resp,
                ):
                    orjson.loads(await resp.read())

            await asyncio.gather(*(one(i) for i in range(calls)))
        return calls, 0.0

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--quick", action="store_true", help="a tenth of the work, one repeat")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    repeats = 1 if args.quick else args.repeats
    reverse_env = pa.load_environment("reverse_text", num_examples=2000 // scale)
    games_env = Games(500 // scale)
    server, base_url = start_server("reverse")
    model = "fake-model"
    rows: list[dict[str, Any]] = []
    loops: dict[str, Callable[[Any], Any]] = {"asyncio": asyncio.run}
    if uvloop is not None:
        loops["uvloop"] = uvloop.run
    try:
        for (loop_name, run), concurrency in itertools.product(loops.items(), args.concurrency):
            cases = {
                ("reverse_text", "palaestra"): palaestra_run(
                    reverse_env, base_url, model, concurrency, "aiohttp"
                ),
                ("reverse_text", "sdk"): palaestra_run(reverse_env, base_url, model, concurrency, "openai"),
                ("reverse_text", "floor"): floor_run(base_url, model, concurrency, 2000 // scale),
                ("games", "palaestra"): palaestra_run(games_env, base_url, model, concurrency, "aiohttp"),
                ("games", "sdk"): palaestra_run(games_env, base_url, model, concurrency, "openai"),
            }
            for (workload, client), work in cases.items():
                runs = [run(measure(work)) for _ in range(repeats)]
                wall = statistics.median(r[0] for r in runs)
                cpu = statistics.median(r[1] for r in runs)
                calls = runs[0][2]
                scoring = statistics.median(r[3] for r in runs)
                rollouts = (
                    len(reverse_env.examples) if workload == "reverse_text" else len(games_env.examples)
                )
                rows.append(
                    dict(
                        loop=loop_name,
                        workload=workload,
                        client=client,
                        concurrency=concurrency,
                        calls=calls,
                        rollouts_s=rollouts / wall,
                        calls_s=calls / wall,
                        cpu_ms=1000 * cpu / calls,
                        scoring_ms=1000 * scoring / calls,
                    )
                )
                print(
                    f"{loop_name:8} {workload:12} {client:9} c={concurrency:<4} {rows[-1]['calls_s']:8.0f} calls/s  "
                    f"{rows[-1]['cpu_ms']:.3f} ms CPU/call",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        server.terminate()
        server.wait(timeout=10)
    print_table(rows)


def print_table(rows: list[dict[str, Any]]) -> None:
    """A markdown table; ratios compare with the floor and the SDK measured on the same loop."""
    cpu = {(r["loop"], r["workload"], r["client"], r["concurrency"]): r["cpu_ms"] for r in rows}
    print(
        "| loop | workload | client | concurrency | model calls | rollouts/s | calls/s "
        "| client CPU ms/call | of which reward fns | ÷ floor | sdk ÷ palaestra |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        floor = cpu[(r["loop"], "reverse_text", "floor", r["concurrency"])]
        sdk = cpu.get((r["loop"], r["workload"], "sdk", r["concurrency"]))
        sdk_ratio = f"{sdk / r['cpu_ms']:.1f}×" if r["client"] == "palaestra" and sdk else ""
        rollouts_s = "" if r["client"] == "floor" else f"{r['rollouts_s']:.0f}"
        print(
            f"| {r['loop']} | {r['workload']} | {r['client']} | {r['concurrency']} | {r['calls']} | {rollouts_s} | "
            f"{r['calls_s']:.0f} | {r['cpu_ms']:.3f} | {r['scoring_ms']:.3f} | {r['cpu_ms'] / floor:.2f}× | {sdk_ratio} |"
        )


if __name__ == "__main__":
    main()
