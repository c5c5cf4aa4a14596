"""The game engine and the minimax solver: rules, rendering, known positions, optimal play."""

from __future__ import annotations

import random
import time

import pytest
from tictactoe.game import (
    EMPTY_BOARD,
    LINES,
    Mark,
    free_cells,
    is_over,
    other,
    parse_board,
    play,
    render,
    winner,
)
from tictactoe.protocol import result
from tictactoe.solver import optimal_moves, solve, value


def test_a_board_takes_marks_on_free_cells_only() -> None:
    board = play(EMPTY_BOARD, 4, "X")
    assert board == "....X...."
    assert free_cells(board) == [0, 1, 2, 3, 5, 6, 7, 8]
    with pytest.raises(ValueError, match="not free"):
        play(board, 4, "O")
    with pytest.raises(ValueError, match="not free"):
        play(board, 9, "O")


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("mark", ["X", "O"])
def test_three_in_a_row_wins_on_every_line(line: tuple[int, int, int], mark: Mark) -> None:
    board = EMPTY_BOARD
    for cell in line:
        assert winner(board) is None
        board = play(board, cell, mark)
    assert winner(board) == mark and is_over(board)


def test_a_full_board_without_a_line_is_a_draw() -> None:
    board = "XOXXOOOXX"
    assert winner(board) is None and is_over(board) and result(board) == "draw"
    assert not is_over("XOXXOOOX.")


def test_rendering_shows_marks_and_free_cell_numbers() -> None:
    assert render(EMPTY_BOARD) == "0 | 1 | 2\n---------\n3 | 4 | 5\n---------\n6 | 7 | 8"
    assert render("X...O...X") == "X | 1 | 2\n---------\n3 | O | 5\n---------\n6 | 7 | X"


def test_parse_board_reads_back_every_reachable_position() -> None:
    for board in solve():
        assert parse_board(render(board)) == board


def test_parse_board_is_lenient_with_layout_and_takes_the_last_grid() -> None:
    text = f"Earlier:\n{render('X........')}\n\nNow:\r\n  X|1 |  O \r\n---\n3 | X | 5\n6|7|8  \nYour move."
    assert parse_board(text) == "X.O.X...."
    assert parse_board("no board here") is None
    assert parse_board("0 | 1 | 2\n3 | 4 | 5\n6 | 8 | 7") is None  # numbers out of place: not ours


def test_the_solver_covers_every_reachable_position_once() -> None:
    table = solve()
    assert len(table) == 5478
    assert solve() is table  # computed once, then every lookup is a dict access


@pytest.mark.parametrize(
    ("board", "mark", "expected"),
    [
        (EMPTY_BOARD, "X", {0, 1, 2, 3, 4, 5, 6, 7, 8}),  # every first move draws
        ("X........", "O", {4}),  # against a corner, only the centre holds
        ("....X....", "O", {0, 2, 6, 8}),  # against the centre, only a corner holds
        (".X.......", "O", {0, 2, 4, 7}),  # against an edge: centre, adjacent corners, far edge
        ("XX.OO....", "X", {2}),  # win at once
        ("XX..O....", "O", {2}),  # block, or lose
        ("O...X...O", "X", {1, 3, 5, 7}),  # opposite corners: only an edge stops the fork
    ],
)
def test_optimal_moves_of_known_positions(board: str, mark: Mark, expected: set[int]) -> None:
    assert set(optimal_moves(board, mark)) == expected


def test_o_first_positions_are_answered_by_symmetry() -> None:
    assert optimal_moves("O........", "X") == (4,)
    assert value("OO..X....", "X") == 0 and optimal_moves("OO..X....", "X") == (2,)
    assert value("....O....", "X") == 0
    with pytest.raises(ValueError, match="not a reachable position"):
        optimal_moves("XXX......", "O")  # X cannot have moved three times in a row
    with pytest.raises(ValueError, match="a board is 9 characters"):
        optimal_moves("XO", "X")


def _optimal_games(board: str, mark: Mark) -> set[str]:
    """The results of every game where both sides play any optimal move."""
    if is_over(board):
        return {str(result(board))}
    return set().union(
        *(_optimal_games(play(board, c, mark), other(mark)) for c in optimal_moves(board, mark))
    )


def test_two_optimal_players_always_draw_whoever_starts() -> None:
    assert _optimal_games(EMPTY_BOARD, "X") == {"draw"}
    assert _optimal_games(EMPTY_BOARD, "O") == {"draw"}


def _worst_result(board: str, to_move: Mark, me: Mark) -> int:
    """``me`` plays optimally, the other side tries every move: my worst result (1, 0, -1)."""
    if is_over(board):
        w = winner(board)
        return 0 if w is None else (1 if w == me else -1)
    cells = optimal_moves(board, to_move) if to_move == me else free_cells(board)
    return min(_worst_result(play(board, c, to_move), other(to_move), me) for c in cells)


def test_the_optimal_player_never_loses_to_any_line_of_play() -> None:
    sides: tuple[Mark, Mark] = ("X", "O")
    for me in sides:
        for starter in sides:
            assert _worst_result(EMPTY_BOARD, starter, me) >= 0


def test_the_optimal_player_never_loses_10000_random_games_in_seconds() -> None:
    rng = random.Random(0)
    results = {"win": 0, "draw": 0, "loss": 0}
    start = time.perf_counter()
    for game in range(10_000):
        board: str = EMPTY_BOARD
        mark: Mark = "X" if game % 2 else "O"  # X, the optimal side, starts half the games
        while result(board) is None:
            cell = rng.choice(optimal_moves(board, mark) if mark == "X" else free_cells(board))
            board, mark = play(board, cell, mark), other(mark)
        results[str(result(board))] += 1
    assert results["loss"] == 0
    assert results["win"] > 8_000  # a random opponent blunders most games away
    assert time.perf_counter() - start < 5
