"""The game itself: a board, its legal moves, the winner, and its text rendering.

A board is a 9-character string, one character per cell, row by row: ``"X"``, ``"O"`` or ``"."``
for a free cell. Strings are immutable and hashable, so a board is its own cache key and seed
part, and reads at a glance in saved rollouts (``"X...O...."``).
"""

from __future__ import annotations

import re
from typing import Literal

Mark = Literal["X", "O"]
FREE = "."
EMPTY_BOARD = FREE * 9
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
CENTRE = 4
CORNERS = (0, 2, 6, 8)

_ROW = re.compile(r"^[ \t]*([0-8XO])[ \t]*\|[ \t]*([0-8XO])[ \t]*\|[ \t]*([0-8XO])[ \t]*$", re.M)


def other(mark: Mark) -> Mark:
    """The opponent's mark."""
    return "O" if mark == "X" else "X"


def check_board(board: str) -> str:
    """``board`` itself if it is 9 cells of ``X``, ``O`` or ``.``; else ``ValueError``."""
    if not isinstance(board, str) or len(board) != 9 or set(board) - {"X", "O", FREE}:
        raise ValueError(f"a board is 9 characters of 'X', 'O' or '.', got {board!r:.40}")
    return board


def free_cells(board: str) -> list[int]:
    """The free cells, in increasing order: the legal moves."""
    return [i for i, c in enumerate(board) if c == FREE]


def play(board: str, cell: int, mark: Mark) -> str:
    """The board after ``mark`` takes ``cell``; ``ValueError`` if the cell is not free."""
    if not 0 <= cell <= 8 or board[cell] != FREE:
        raise ValueError(f"cell {cell} is not free on {board!r}")
    return board[:cell] + mark + board[cell + 1 :]


def winner(board: str) -> Mark | None:
    """The mark with three in a row, or None."""
    for a, b, c in LINES:
        if board[a] != FREE and board[a] == board[b] == board[c]:
            return "X" if board[a] == "X" else "O"
    return None


def winning_line(board: str) -> tuple[int, int, int] | None:
    """The completed line, or None."""
    return next(
        (line for line in LINES if board[line[0]] != FREE and len({board[i] for i in line}) == 1), None
    )


def is_over(board: str) -> bool:
    """True once someone has three in a row or the board is full."""
    return winner(board) is not None or FREE not in board


def render(board: str) -> str:
    """The board as shown to the model: each mark, or a free cell's number.

    ```
    X | 1 | 2
    ---------
    3 | O | 5
    ---------
    6 | 7 | 8
    ```
    """
    cells = [c if c != FREE else str(i) for i, c in enumerate(board)]
    rows = [" | ".join(cells[r : r + 3]) for r in (0, 3, 6)]
    return "\n---------\n".join(rows)


def parse_board(text: str) -> str | None:
    """The board in the last ``render``-ed grid found in ``text``; None if there is none.

    Tolerates any spacing, CRLF line ends and text around the grid; a grid whose free cells do
    not show their own numbers is rejected (it is not one of ours).
    """
    rows = _ROW.findall(text.replace("\r", ""))
    if len(rows) < 3:
        return None
    cells = [c for row in rows[-3:] for c in row]
    if any(c.isdigit() and int(c) != i for i, c in enumerate(cells)):
        return None
    return "".join(c if c in "XO" else FREE for c in cells)
