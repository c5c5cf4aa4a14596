"""The tic-tac-toe evaluation protocol for the scripted players, written into the env's README.

Protocol (the reference game's evaluation protocol): 200 games, one rollout each, against the optimal opponent and
against the random opponent; report wins / draws / losses, format rate, share of games with an
invalid move, and mean reward. Each game runs through ``env.run`` with a ``ScriptedClient``, the
same path as ``palaestra eval tictactoe -m scripted:tictactoe:NAME -a '{"opponent": ...}'``.

The table replaces the one between the marker comments in ``environments/tictactoe/README.md``
(so reruns update it) and is printed.

Usage: python benchmarks/tictactoe_players.py [--games 200] [--seed 0] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Callable
from pathlib import Path

import tictactoe

import palaestra as pa

README = Path(__file__).resolve().parent.parent / "environments" / "tictactoe" / "README.md"
BEGIN, END = "<!-- players-table:begin -->", "<!-- players-table:end -->"
PLAYERS: list[tuple[str, Callable[..., str]]] = [
    ("random_player", tictactoe.random_player),
    ("heuristic_player", tictactoe.heuristic_player),
    ("noisy_player(0.5)", tictactoe.noisy_player(0.5)),
    ("noisy_player(0.2)", tictactoe.noisy_player(0.2)),
    ("teacher_player = candidates_player(0.2)", tictactoe.teacher_player),
    ("optimal_player", tictactoe.optimal_player),
]


async def evaluate(policy: Callable[..., str], opponent: str, games: int, seed: int) -> dict[str, float]:
    """W/D/L counts, format rate, share of games with an invalid move and mean reward."""
    env = tictactoe.load_environment(num_examples=games, opponent=opponent)
    rollouts = await env.run(
        pa.ScriptedClient(policy), pa.RunSpec(num_examples=games, rollouts_per_example=1, seed=seed)
    )
    errors = [r.error for r in rollouts if r.error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} rollouts failed, e.g. {errors[0]}")

    def mean(name: str) -> float:
        return statistics.fmean(r.metrics[name] for r in rollouts)

    return {
        "won": sum(r.metrics["won"] for r in rollouts),
        "drew": sum(r.metrics["drew"] for r in rollouts),
        "lost": sum(r.metrics["lost"] for r in rollouts),
        "format": mean("format_reward"),
        "invalid": mean("had_invalid_move"),
        "reward": statistics.fmean(r.reward for r in rollouts if r.reward is not None),
    }


def wdl(result: dict[str, float], games: int) -> str:
    """Wins / draws / losses in % of the games."""
    return "/".join(f"{100 * result[k] / games:.1f}" for k in ("won", "drew", "lost"))


async def measure(games: int, seed: int) -> str:
    """The Markdown table of every player against both opponents."""
    lines = [
        "| player | vs optimal W/D/L % | vs random W/D/L % | format | games with invalid moves "
        "(optimal) | mean reward vs optimal | mean reward vs random |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, policy in PLAYERS:
        optimal = await evaluate(policy, "optimal", games, seed)
        random_ = await evaluate(policy, "random", games, seed)
        fmt = (optimal["format"] + random_["format"]) / 2
        lines.append(
            f"| `{name}` | {wdl(optimal, games)} | {wdl(random_, games)} | {fmt:.0%} | {optimal['invalid']:.0%} "
            f"| {optimal['reward']:.3f} | {random_['reward']:.3f} |"
        )
    return "\n".join(lines)


def write_table(table: str, command: str, seed: int) -> None:
    """Replace the text between the markers in the README."""
    text = README.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README}: markers {BEGIN} ... {END} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    block = f"{BEGIN}\n\nMeasured with `{command}` (dataset seed 0, run seed {seed}):\n\n{table}\n\n{END}"
    README.write_text(head + block + tail, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=200, help="games per player and opponent")
    parser.add_argument("--seed", type=int, default=0, help="run seed (the players' rng)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave the README alone")
    args = parser.parse_args()
    table = asyncio.run(measure(args.games, args.seed))
    print(table)
    if not args.no_write:
        command = "python benchmarks/tictactoe_players.py"
        command += f" --games {args.games}" if args.games != 100 else ""
        command += f" --seed {args.seed}" if args.seed else ""
        write_table(table, command, args.seed)
        print(f"written to {README}")


if __name__ == "__main__":
    main()
