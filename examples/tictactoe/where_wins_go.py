"""Where a model's wins against the random opponent go: its saved games, split by who moved first.

    python examples/tictactoe/where_wins_go.py RUN/evals/step-000300/random/results.jsonl

For each side it prints the model's win rate beside the best a player can reach against a
uniformly random opponent (always taking the move of the highest expected score: a win 1, a draw
0.5), the best while never leaving minimax play, and minimax play choosing uniformly among its
optimal moves (the environment's optimal player); then how many of the model's legal replies were
minimax-optimal and how many took the move of the highest expected score. The model plays X.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from functools import cache
from pathlib import Path
from statistics import fmean

from tictactoe.game import EMPTY_BOARD, free_cells, is_over, parse_board, play, winner
from tictactoe.solver import optimal_moves

MOVE = re.compile(r"<move>\s*(\d)\s*</move>")


@cache
def expected(board: str, to_move: str, policy: str) -> tuple[float, float]:
    """(P(X wins), P(draw)) from ``board`` with ``to_move`` next, O random, X playing ``policy``:
    "best" (highest expected score), "best-optimal" (the same among minimax-optimal moves) or
    "uniform-optimal" (a uniformly random minimax-optimal move)."""
    if is_over(board):
        return (1.0 if winner(board) == "X" else 0.0, 1.0 if winner(board) is None else 0.0)
    if to_move == "O":
        outcomes = [expected(play(board, c, "O"), "X", policy) for c in free_cells(board)]
        return (fmean(o[0] for o in outcomes), fmean(o[1] for o in outcomes))
    cells = free_cells(board) if policy == "best" else list(optimal_moves(board, "X"))
    outcomes = [expected(play(board, c, "X"), "O", policy) for c in cells]
    if policy == "uniform-optimal":
        return (fmean(o[0] for o in outcomes), fmean(o[1] for o in outcomes))
    return max(outcomes, key=lambda o: o[0] + 0.5 * o[1])


def score(board: str, to_move: str) -> float:
    win, draw = expected(board, to_move, "best")
    return win + 0.5 * draw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a saved run's results.jsonl against the random opponent")
    args = parser.parse_args()
    counts: Counter[str] = Counter()
    for line in args.results.read_text().splitlines():
        record = json.loads(line)
        messages = record["prompt"] + record["completion"]
        side = "second" if "moved first" in messages[1]["content"] else "first"
        counts[f"{side} games"] += 1
        counts[f"{side} won"] += int(record["metrics"]["won"])
        board = None
        for message in messages:
            if message["role"] == "user":
                board = parse_board(str(message["content"]))
            elif message["role"] == "assistant" and board is not None:
                move = MOVE.search(str(message.get("content") or ""))
                if move is None or int(move.group(1)) not in free_cells(board):
                    continue
                cell = int(move.group(1))
                counts[f"{side} replies"] += 1
                counts[f"{side} optimal"] += cell in optimal_moves(board, "X")
                best = max(score(play(board, c, "X"), "O") for c in free_cells(board))
                counts[f"{side} best"] += score(play(board, cell, "X"), "O") >= best - 1e-9
    for side, start in (("first", EMPTY_BOARD), ("second", None)):
        games = counts[f"{side} games"]
        if not games:
            continue
        if start is None:  # the opponent's first move is random too
            reach = {
                p: fmean(expected(play(EMPTY_BOARD, c, "O"), "X", p)[0] for c in range(9)) for p in POLICIES
            }
        else:
            reach = {p: expected(start, "X", p)[0] for p in POLICIES}
        replies = counts[f"{side} replies"]
        print(
            f"model moves {side}: won {counts[f'{side} won']} of {games} ({counts[f'{side} won'] / games:.1%}); "
            + ", ".join(f"{p} {v:.1%}" for p, v in reach.items())
            + f"; replies minimax-optimal {counts[f'{side} optimal'] / replies:.1%}, "
            f"highest expected score {counts[f'{side} best'] / replies:.1%} of {replies}"
        )


POLICIES = ("best", "best-optimal", "uniform-optimal")

if __name__ == "__main__":
    main()
