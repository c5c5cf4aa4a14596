"""Exact minimax over the whole game tree, solved once, so every lookup is a dict access.

The table holds every position reachable when X moves first (5,478, finished ones included).
A position where O moved first is the same position with the marks swapped, so one table
answers for both. Values are game-theoretic: +1 the player to move wins with best play, 0 draw,
-1 loss. ``optimal_moves`` returns **all** moves that keep the best value: an opponent that
always took the first one would be predictable, and a student would memorise it.
"""

from __future__ import annotations

from functools import cache

from tictactoe.game import EMPTY_BOARD, Mark, check_board, free_cells, is_over, play, winner

_SWAP = str.maketrans("XO", "OX")


@cache
def solve() -> dict[str, tuple[int, tuple[int, ...]]]:
    """Every position reachable with X first → (value for the player to move, its optimal moves).

    Computed on first use (about 50 ms) and cached for the life of the process.
    """
    table: dict[str, tuple[int, tuple[int, ...]]] = {}

    def visit(board: str, mark: Mark) -> int:
        if board in table:
            return table[board][0]
        if is_over(board):
            table[board] = (-1 if winner(board) else 0, ())  # the player to move has lost, or drawn
            return table[board][0]
        scores = {
            cell: -visit(play(board, cell, mark), "O" if mark == "X" else "X") for cell in free_cells(board)
        }
        best = max(scores.values())
        table[board] = (best, tuple(cell for cell, score in scores.items() if score == best))
        return best

    visit(EMPTY_BOARD, "X")
    return table


def to_move(board: str) -> Mark:
    """Whose turn it is when X moved first: the mark with fewer cells, X on a tie."""
    return "O" if board.count("X") > board.count("O") else "X"


def _lookup(board: str, mark: Mark | None) -> tuple[int, tuple[int, ...]]:
    check_board(board)
    mark = mark or to_move(board)
    x_first = board.count("X") - board.count("O") == (0 if mark == "X" else 1)
    # a position reached with O first is the X-first position with the marks swapped
    entry = solve().get(board if x_first else board.translate(_SWAP))
    if entry is None:
        raise ValueError(f"{board!r} with {mark} to move is not a reachable position")
    return entry


def optimal_moves(board: str, mark: Mark | None = None) -> tuple[int, ...]:
    """All optimal moves for ``mark`` (default: whoever moves next when X started); () if over."""
    return _lookup(board, mark)[1]


def value(board: str, mark: Mark | None = None) -> int:
    """The result with best play from here, for ``mark`` to move: 1 win, 0 draw, -1 loss."""
    return _lookup(board, mark)[0]


def outcome_word(score: int) -> str:
    """``value`` in words, for explanations."""
    return {1: "a forced win", 0: "a draw", -1: "a loss"}[score]
