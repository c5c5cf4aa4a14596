"""examples/tictactoe/where_wins_go.py on saved games of the environment's optimal player: every one
of its legal replies is minimax-optimal, its wins are counted per side as the run saved them, and
the exact win rates against a uniformly random opponent are the ones the README quotes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from palaestra.cli import main

pytest.importorskip("tictactoe")

SCRIPT = Path(__file__).parent.parent / "examples" / "tictactoe" / "where_wins_go.py"


def test_the_optimal_players_games_read_as_minimax_play(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = json.dumps({"opponent": "random", "num_examples": 40})
    player = "scripted:tictactoe:optimal_player"
    assert (
        main(["eval", "tictactoe", "-m", player, "-a", args, "-n", "40", "-r", "1", "-o", str(tmp_path)]) == 0
    )
    capsys.readouterr()
    results = next(tmp_path.rglob("results.jsonl"))
    records = [json.loads(line) for line in results.read_text().splitlines()]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(results)], capture_output=True, text=True, check=True
    )
    lines = dict(re.findall(r"model moves (first|second): (.*)", out.stdout))
    assert set(lines) == {"first", "second"}, out.stdout
    won = sum(int(r["metrics"]["won"]) for r in records)
    counted = [re.search(r"won (\d+) of (\d+)", lines[side]) for side in ("first", "second")]
    assert sum(int(m.group(1)) for m in counted if m) == won
    assert sum(int(m.group(2)) for m in counted if m) == len(records)
    for side in lines:
        assert "replies minimax-optimal 100.0%" in lines[side]
    assert "best 99.5%" in lines["first"] and "uniform-optimal 96.8%" in lines["first"]
    assert "best 93.1%" in lines["second"] and "uniform-optimal 77.7%" in lines["second"]
