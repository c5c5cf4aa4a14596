"""Whether a model reads the board: its saved games, reply by reply.

    python examples/tictactoe/reads_the_board.py RUN/evals/step-000000/random/results.jsonl [...]

A student can fail to play legal moves in two ways that its SFT loss does not tell apart. It may
not *read the board* (the cells its think names, and the cell it plays, are not the free ones),
or it may not *copy its own think* (it names a free cell, then plays another). For each file this
prints, over the model's replies:

- legal first attempts: replies to a position the opponent just left, whose move is a free cell;
- legal retries: the same for replies after an invalid one (the environment says why and asks
  again; teacher data filtered to games without invalid moves never shows this);
- named cells free: replies whose think lists cells (the teacher's ``Best: 2, 6.``) all free;
- move = named cell: replies whose move is the cell their think says it plays (``I play 6``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from tictactoe.game import free_cells, parse_board

MOVE = re.compile(r"<move>\s*(\d)\s*</move>")
LISTED = re.compile(r"Best: ([\d, ]+)\.")
PLAYS = re.compile(r"I play (\d)")


def reading(records: list[dict[str, Any]]) -> Counter[str]:
    """Counts over the replies of ``records`` (saved rollouts): ``first``/``retry`` replies and how
    many were legal (``first legal``, ``retry legal``), ``listed``/``listed free``, ``named``/``named played``."""
    counts: Counter[str] = Counter()
    for record in records:
        messages = record["prompt"] + record["completion"]
        for before, reply in itertools.pairwise(messages):
            if reply["role"] != "assistant" or before["role"] != "user":
                continue
            text, asked = str(reply.get("content") or ""), str(before.get("content") or "")
            board = parse_board(asked)
            if board is None:
                continue
            free = set(free_cells(board))
            move = MOVE.search(text)
            kind = "retry" if asked.startswith("Invalid") else "first"
            counts[kind] += 1
            counts[f"{kind} legal"] += move is not None and int(move.group(1)) in free
            listed = LISTED.search(text)
            if listed:
                counts["listed"] += 1
                counts["listed free"] += all(int(c) in free for c in re.findall(r"\d", listed.group(1)))
            named = PLAYS.search(text)
            if named and move:
                counts["named"] += 1
                counts["named played"] += named.group(1) == move.group(1)
    return counts


def line(counts: Counter[str]) -> str:
    def share(part: str, whole: str) -> str:
        return f"{counts[part] / counts[whole]:.1%} of {counts[whole]}" if counts[whole] else "none"

    return (
        f"legal first attempts {share('first legal', 'first')}; legal retries {share('retry legal', 'retry')}; "
        f"named cells free {share('listed free', 'listed')}; move = named cell {share('named played', 'named')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+", help="saved runs' results.jsonl")
    args = parser.parse_args()
    for path in args.results:
        records = [json.loads(row) for row in path.read_text().splitlines() if row.strip()]
        print(f"{path}: {line(reading(records))}")


if __name__ == "__main__":
    main()
