"""Players: functions ``(board, mark, rng) -> Move`` that pick a free cell and say why.

The same players serve as the environment's opponent (``noisy(random_move_prob)``) and, through
``scripted``, as a "model" that reads the board from the conversation and replies in the
environment's format with a one-line ``<think>`` explaining the move::

    palaestra eval tictactoe -m scripted:tictactoe:heuristic_player -a '{"opponent": "optimal"}'
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import palaestra as pa
from tictactoe.game import CENTRE, CORNERS, FREE, LINES, Mark, free_cells, other, parse_board
from tictactoe.protocol import INVALID
from tictactoe.solver import optimal_moves, outcome_word, value


@dataclass(frozen=True)
class Move:
    """A chosen cell and a short explanation of the choice."""

    cell: int
    reason: str


Player = Callable[[str, Mark, random.Random], Move]
Policy = Callable[[list[dict[str, Any]], random.Random], str]


def random_move(board: str, mark: Mark, rng: random.Random) -> Move:
    """A uniformly random free cell."""
    cell = rng.choice(free_cells(board))
    return Move(cell, f"Playing a random free cell: {cell}.")


def optimal_move(board: str, mark: Mark, rng: random.Random) -> Move:
    """A move drawn uniformly among **all** optimal moves (never "the first optimal one")."""
    best = optimal_moves(board, mark)
    cell = rng.choice(best)
    if _completes_line(board, cell, mark):
        return Move(cell, f"Cell {cell} completes three in a row.")
    word = outcome_word(value(board, mark))
    return Move(
        cell, f"With best play this position is {word}; cell {cell} keeps it (optimal: {_cells(best)})."
    )


def heuristic_move(board: str, mark: Mark, rng: random.Random) -> Move:
    """An imperfect teacher: win if it can, block if it must, else the centre, a corner or any cell.

    With nothing urgent it draws one of the kinds of move still available (the centre, a
    corner, any free cell) at random, so it sometimes answers the centre with an edge; it never
    makes or sees a fork, so a fork set up two moves earlier beats it. Its measured results are
    in the environment's README (``benchmarks/tictactoe_players.py``).
    """
    for cell in free_cells(board):
        if _completes_line(board, cell, mark):
            return Move(cell, f"I can win: cell {cell} completes my line.")
    threats = [cell for cell in free_cells(board) if _completes_line(board, cell, other(mark))]
    if threats:
        return Move(threats[0], f"{other(mark)} threatens to win at {threats[0]}: I block it.")
    corners = [c for c in CORNERS if board[c] == FREE]
    kinds = [
        k for k, ok in (("centre", board[CENTRE] == FREE), ("corner", bool(corners)), ("any", True)) if ok
    ]
    kind = rng.choice(kinds)
    if kind == "centre":
        return Move(CENTRE, "No threats; the centre is free and is on the most lines.")
    if kind == "corner":
        cell = rng.choice(corners)
        return Move(cell, f"No threats; a corner is on three lines: taking {cell}.")
    cell = rng.choice(free_cells(board))
    return Move(cell, f"No threats on the board; taking cell {cell}.")


def noisy(random_move_prob: float) -> Player:
    """Random with probability ``random_move_prob``, else optimal: the environment's opponent."""
    check_probability("random_move_prob", random_move_prob)

    def noisy_move(board: str, mark: Mark, rng: random.Random) -> Move:
        if rng.random() < random_move_prob:
            return random_move(board, mark, rng)
        return optimal_move(board, mark, rng)

    noisy_move.__name__ = f"noisy_{random_move_prob:g}"
    return noisy_move


def candidates(random_move_prob: float) -> Player:
    """A teacher that shows its work: its think names the optimal cells, then it plays one of them,
    or with probability ``random_move_prob`` a random free cell, and says so.

    At 0.2 it is about as strong as ``heuristic_move`` against the optimal opponent (~71% draws),
    so a student that learns from it has a teacher to go beyond. Its think is what a small model
    can copy from: the cell it names is the cell it plays, and the cells it lists are free.
    """
    check_probability("random_move_prob", random_move_prob)

    def candidates_move(board: str, mark: Mark, rng: random.Random) -> Move:
        best = optimal_moves(board, mark)
        if rng.random() < random_move_prob:
            cell = rng.choice(free_cells(board))
            return Move(cell, f"Best: {_cells(best)}. I play {cell} at random.")
        cell = rng.choice(best)
        return Move(cell, f"Best: {_cells(best)}. I play {cell}.")

    candidates_move.__name__ = f"candidates_{random_move_prob:g}"
    return candidates_move


def check_probability(name: str, p: float) -> None:
    if isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {p!r}")


def _completes_line(board: str, cell: int, mark: Mark) -> bool:
    return board[cell] == FREE and any(
        cell in line and sum(board[i] == mark for i in line) == 2 for line in LINES
    )


def _cells(cells: tuple[int, ...] | list[int]) -> str:
    return ", ".join(map(str, cells))


# Scripted "models": read the board, reply in the environment's format.


def board_from_messages(messages: list[dict[str, Any]]) -> str:
    """The board in the last user message of the conversation; ``ValueError`` if it shows none."""
    for message in reversed(messages):
        if message.get("role") == "user":
            board = parse_board(pa.content_text(message.get("content")))
            if board is None:
                raise ValueError("the last user message shows no tic-tac-toe board")
            return board
    raise ValueError("the conversation has no user message")


def scripted(player: Player, *, mark: Mark = "X", name: str | None = None) -> Policy:
    """``player`` as a ScriptedClient policy ``(messages, rng) -> reply``.

    The reply is a one-line ``<think>`` with the player's reason, then ``<move>N</move>``.
    """

    def policy(messages: list[dict[str, Any]], rng: random.Random) -> str:
        move = player(board_from_messages(messages), mark, rng)
        return f"<think>{move.reason}</think>\n<move>{move.cell}</move>"

    policy.__name__ = name or f"{getattr(player, '__name__', 'player')}_player"
    policy.__doc__ = (
        f"Plays {mark} with {getattr(player, '__name__', 'a player')}, replying in the env's format."
    )
    return policy


random_player = scripted(random_move, name="random_player")
optimal_player = scripted(optimal_move, name="optimal_player")
heuristic_player = scripted(heuristic_move, name="heuristic_player")
teacher_player = scripted(candidates(0.2), name="teacher_player")  # the recipe's teacher


def recovering(policy: Policy, mistake_prob: float) -> Policy:
    """``policy`` with deliberate mistakes to recover from: teacher data that shows the recovery.

    Once per game at most, on a turn with a taken cell, with probability ``mistake_prob``, it
    names a taken cell and plays it. The environment rejects the move (the board unchanged) and
    the policy answers that message as ``policy`` would. ``palaestra data filter --mask-rejected
    '^Invalid move'`` gives the mistakes weight 0: SFT trains the student on the reply after a
    rejection, which teacher games without mistakes never show it, and not on the mistake.
    """
    check_probability("mistake_prob", mistake_prob)

    def recovering_policy(messages: list[dict[str, Any]], rng: random.Random) -> str:
        board = board_from_messages(messages)
        taken = [cell for cell in range(9) if board[cell] != FREE]
        erred = any(
            m.get("role") == "user" and pa.content_text(m.get("content")).startswith(INVALID)
            for m in messages
        )
        if taken and not erred and rng.random() < mistake_prob:
            cell = rng.choice(taken)
            return f"<think>Best: {cell}. I play {cell}.</think>\n<move>{cell}</move>"
        return policy(messages, rng)

    recovering_policy.__name__ = f"recovering_{getattr(policy, '__name__', 'policy')}"
    recovering_policy.__doc__ = (
        f"{policy.__doc__} Plays a taken cell once per game with {mistake_prob:g} a turn."
    )
    return recovering_policy


# the recipe's teacher data: the teacher, with a rejected mistake to recover from in ~1 game in 3
recovering_teacher_player = recovering(teacher_player, 0.1)


def noisy_player(p: float) -> Policy:
    """A scripted model that plays randomly with probability ``p``, else optimally."""
    return scripted(noisy(p), name=f"noisy_player_{p:g}")


def candidates_player(p: float) -> Policy:
    """A scripted model that names the optimal cells, then plays one (a random cell with ``p``)."""
    return scripted(candidates(p), name=f"candidates_player_{p:g}")
