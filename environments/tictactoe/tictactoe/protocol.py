"""The text contract with the model: the prompts, and how a reply is read as a move.

Shared by the environment and by ``palaestra play``, so a person faces the model with exactly
the prompts it is trained and evaluated on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import palaestra as pa
from tictactoe.game import EMPTY_BOARD, FREE, free_cells, render, winner

Variant = Literal["standard", "talk_v1"]
Outcome = Literal["win", "draw", "loss", "unfinished"]
VARIANTS: tuple[Variant, ...] = ("standard", "talk_v1")

_RULES = f"""The cells are numbered 0 to 8, row by row:

{render(EMPTY_BOARD)}

Players take turns marking one free cell. The first to get three of their marks in a row \
(across, down or diagonally) wins; a full board with no such line is a draw."""

SYSTEM_PROMPT = f"""You are playing tic-tac-toe as X against an opponent who plays O.
{_RULES}

On each turn you may first reason briefly inside <think>...</think>; then give the number of a \
free cell inside <move>...</move>. For example:
<think>The centre is on four lines.</think>
<move>4</move>
A reply without a valid move is not played: you are told why and asked again."""

SYSTEM_PROMPT_V1 = f"""You are playing tic-tac-toe as X and you move first; your opponent plays O.
{_RULES}

On each turn, give the number of a free cell inside <move>...</move>, for example <move>4</move>.
An invalid move (no <move> tag, or a cell that is not free) loses the game."""

_ONE_DIGIT = re.compile(r"[0-9]")
_INTEGER = re.compile(r"[+-]?[0-9]+")


def system_prompt(variant: Variant) -> str:
    """The system prompt of ``variant``."""
    return SYSTEM_PROMPT_V1 if variant == "talk_v1" else SYSTEM_PROMPT


def turn_message(event: str, board: str) -> str:
    """A user turn: what happened, the board, the free cells, and the request for a move."""
    cells = ", ".join(map(str, free_cells(board)))
    return f"{event}\n\n{render(board)}\n\nFree cells: {cells}\nYour move (X)."


def game_over_message(event: str, board: str) -> str:
    """The last message of a game: what happened, the final board, and the result."""
    return f"{event}\n\n{render(board)}\n\nGame over."


def opening_event(opening: int | None) -> str:
    """The first turn's news: who moved first."""
    if opening is None:
        return "New game. You play X and you move first."
    return f"New game. You play X; your opponent (O) moved first and played cell {opening}."


def opponent_event(cell: int) -> str:
    return f"Your opponent (O) played cell {cell}."


INVALID = "Invalid move:"  # how the user turn after a rejected reply begins


def invalid_event(problem: str) -> str:
    return (
        f"{INVALID} {problem}. The board is unchanged and your opponent has not moved; "
        "reply with a free cell inside <move>...</move>."
    )


@dataclass(frozen=True)
class Verdict:
    """A reply read as a move: ``cell`` when it is a legal move, else ``problem`` says why not."""

    cell: int | None
    problem: str | None = None


def read_move(text: str, board: str, parser: pa.XMLParser) -> Verdict:
    """The move in ``text``: its **last** ``<move>`` block, which must hold one free cell's digit."""
    raw = parser.parse(text).get("move")
    if raw is None:
        return Verdict(None, "your reply has no <move>...</move>")
    if raw == "":
        return Verdict(None, "the <move> tag is empty")
    shown = raw if len(raw) <= 20 else raw[:20] + "…"
    if not _ONE_DIGIT.fullmatch(raw):
        if _INTEGER.fullmatch(raw) and not (len(raw) <= 3 and 0 <= int(raw) <= 8):
            return Verdict(None, f"there is no cell {shown}: cells are 0 to 8")
        return Verdict(None, f"{shown!r} is not a cell number: write a single digit from 0 to 8")
    cell = int(raw)
    if cell > 8:
        return Verdict(None, f"there is no cell {cell}: cells are 0 to 8")
    if board[cell] != FREE:
        return Verdict(None, f"cell {cell} is already taken by {board[cell]}")
    return Verdict(cell)


def result(board: str) -> Outcome | None:
    """The model's (X's) result once the game is over; None while it goes on."""
    mark = winner(board)
    if mark is not None:
        return "win" if mark == "X" else "loss"
    return "draw" if FREE not in board else None
