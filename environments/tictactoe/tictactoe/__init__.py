"""Tic-tac-toe: the reference environment of the talk that started palaestra, "Let LLMs Wander".

``load_environment`` builds it; ``random_player``, ``optimal_player``, ``heuristic_player``,
``teacher_player`` (the recipe's teacher), ``recovering_teacher_player`` (the same with a rejected
mistake to recover from in about one game in three: the recipe's teacher data), ``noisy_player(p)``,
``candidates_player(p)`` and ``recovering(policy, p)`` are scripted "models" for ``ScriptedClient`` or the CLI
(``-m scripted:tictactoe:optimal_player``).
"""

from tictactoe.env import TicTacToeEnv, load_environment, make_dataset, opponent_move
from tictactoe.game import EMPTY_BOARD, free_cells, parse_board, play, render, winner
from tictactoe.players import (
    Move,
    candidates,
    candidates_player,
    heuristic_move,
    heuristic_player,
    noisy,
    noisy_player,
    optimal_move,
    optimal_player,
    random_move,
    random_player,
    recovering,
    recovering_teacher_player,
    scripted,
    teacher_player,
)
from tictactoe.protocol import read_move
from tictactoe.solver import optimal_moves, value

__all__ = [
    "EMPTY_BOARD",
    "Move",
    "TicTacToeEnv",
    "candidates",
    "candidates_player",
    "free_cells",
    "heuristic_move",
    "heuristic_player",
    "load_environment",
    "make_dataset",
    "noisy",
    "noisy_player",
    "opponent_move",
    "optimal_move",
    "optimal_moves",
    "optimal_player",
    "parse_board",
    "play",
    "random_move",
    "random_player",
    "read_move",
    "recovering",
    "recovering_teacher_player",
    "render",
    "scripted",
    "teacher_player",
    "value",
    "winner",
]
