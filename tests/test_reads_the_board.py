"""examples/tictactoe/reads_the_board.py: the teacher's own games read as a player that reads the
board and copies its think; a hand-made game with an occupied cell, a retry and a move that is
not the named cell is counted as each of those."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from palaestra.cli import main

pytest.importorskip("tictactoe")

SCRIPT = Path(__file__).parent.parent / "examples" / "tictactoe" / "reads_the_board.py"


def script() -> Any:
    spec = importlib.util.spec_from_file_location("reads_the_board", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_teachers_games_read_the_board_and_play_the_named_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = json.dumps({"opponent": "random", "num_examples": 30})
    teacher = "scripted:tictactoe:teacher_player"
    assert (
        main(["eval", "tictactoe", "-m", teacher, "-a", args, "-n", "30", "-r", "1", "-o", str(tmp_path)])
        == 0
    )
    capsys.readouterr()
    results = next(tmp_path.rglob("results.jsonl"))
    records = [json.loads(row) for row in results.read_text().splitlines()]
    counts = script().reading(records)
    replies = sum(len([m for m in r["completion"] if m["role"] == "assistant"]) for r in records)
    assert counts["first"] == counts["first legal"] == counts["listed"] == counts["listed free"] == replies
    assert counts["named"] == counts["named played"] == replies and counts["retry"] == 0
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(results)], capture_output=True, text=True, check=True
    )
    assert f"legal first attempts 100.0% of {replies}; legal retries none" in out.stdout


def test_an_occupied_cell_a_retry_and_an_unnamed_move_are_counted() -> None:
    board = "X | 1 | 2\n---------\n3 | O | 5\n---------\n6 | 7 | 8"
    record = {
        "prompt": [{"role": "system", "content": "rules"}],
        "completion": [
            {"role": "user", "content": f"Your opponent (O) played cell 4.\n\n{board}\n\nYour move (X)."},
            {"role": "assistant", "content": "<think>Best: 4, 8. I play 4.</think>\n<move>4</move>"},
            {
                "role": "user",
                "content": f"Invalid move: cell 4 is already taken by O.\n\n{board}\n\nYour move (X).",
            },
            {"role": "assistant", "content": "<think>Best: 2, 8. I play 2.</think>\n<move>8</move>"},
        ],
    }
    counts = script().reading([record])
    assert (counts["first"], counts["first legal"], counts["retry"], counts["retry legal"]) == (1, 0, 1, 1)
    assert (counts["listed"], counts["listed free"], counts["named"], counts["named played"]) == (2, 1, 2, 1)
    assert script().line(counts).startswith("legal first attempts 0.0% of 1; legal retries 100.0% of 1")
