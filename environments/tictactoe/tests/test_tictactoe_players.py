"""Players: random, optimal (uniform over all optimal moves), noisy, the heuristic teacher, and
their scripted forms that read the board from the conversation and reply in the env's format."""

from __future__ import annotations

import asyncio
import random

import pytest
import tictactoe as ttt
from tictactoe.game import EMPTY_BOARD, free_cells, play
from tictactoe.protocol import opponent_event, read_move, turn_message
from tictactoe.solver import optimal_moves, value

import palaestra as pa

FORMAT = pa.XMLParser(["think", "move"], answer_field="move")


def cells_chosen(player: ttt.players.Player, board: str, draws: int = 300) -> set[int]:
    return {player(board, "X", random.Random(seed)).cell for seed in range(draws)}


def test_random_player_plays_every_free_cell() -> None:
    board = "O...X...."
    assert cells_chosen(ttt.random_move, board) == set(free_cells(board))


def test_optimal_player_chooses_among_all_optimal_moves_not_the_first() -> None:
    assert cells_chosen(ttt.optimal_move, EMPTY_BOARD) == set(range(9))
    assert cells_chosen(ttt.optimal_move, "O...X...O") == {1, 3, 5, 7}
    assert cells_chosen(ttt.optimal_move, "O........") == {4}


def test_noisy_player_mixes_random_and_optimal_moves() -> None:
    board = "O........"  # optimal: only the centre
    assert cells_chosen(ttt.noisy(0.0), board) == {4}
    assert cells_chosen(ttt.noisy(1.0), board) == set(free_cells(board))
    moves = [ttt.noisy(0.5)(board, "X", random.Random(s)).cell for s in range(2000)]
    off_centre = sum(m != 4 for m in moves) / len(moves)
    assert 0.4 < off_centre < 0.5  # half the moves are random, and 1/8 of those hit the centre
    for p in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match="random_move_prob must be a number in"):
            ttt.noisy(p)


def test_the_candidates_teacher_plays_as_noisy_and_names_what_it_plays() -> None:
    boards = ["O........", "X...O...O", "XO..O....", EMPTY_BOARD, "XX.OO...."]
    for board in boards:
        best = optimal_moves(board, "X")
        for seed in range(200):
            move = ttt.candidates(0.2)(board, "X", random.Random(seed))
            # the same moves as noisy(0.2) for the same rng: only the think differs
            assert move.cell == ttt.noisy(0.2)(board, "X", random.Random(seed)).cell
            named = ", ".join(map(str, best))
            assert move.reason in (
                f"Best: {named}. I play {move.cell}.",
                f"Best: {named}. I play {move.cell} at random.",
            )
            if not move.reason.endswith("at random."):
                assert move.cell in best
    reply = ttt.teacher_player(
        [{"role": "user", "content": turn_message("The opponent played 0.", "O........")}], random.Random(0)
    )
    assert FORMAT.parse_answer(reply) in {str(c) for c in range(9)}
    with pytest.raises(ValueError, match="random_move_prob must be a number in"):
        ttt.candidates(1.5)


def test_the_recovering_teacher_errs_once_a_game_at_most_and_then_plays_a_legal_move() -> None:
    env = ttt.load_environment(num_examples=200, seed=1)
    games = asyncio.run(
        env.run(pa.ScriptedClient(ttt.recovering_teacher_player), pa.RunSpec(num_examples=200))
    )
    erred = 0
    for game in games:
        answers = [m["content"] for m in game.completion if m["role"] == "user"]
        rejected = [i for i, text in enumerate(answers) if text.startswith("Invalid move:")]
        assert game.metrics["invalid_moves"] == len(rejected) <= 1
        for i in rejected:
            assert "already taken" in answers[i]  # a taken cell, the mistake it makes
            assert i + 1 < len(answers) and not answers[i + 1].startswith(
                "Invalid move:"
            )  # then a legal move
        erred += bool(rejected)
    assert 0.2 < erred / len(games) < 0.45  # ~1 game in 3 at 0.1 a turn
    always = ttt.recovering(ttt.teacher_player, 1.0)
    messages = [{"role": "user", "content": turn_message(opponent_event(4), "....O....")}]
    assert always(messages, random.Random(0)) == "<think>Best: 4. I play 4.</think>\n<move>4</move>"
    answer = {
        "role": "user",
        "content": "Invalid move: cell 4 is already taken by O. ...\n" + messages[0]["content"],
    }
    reply = always([*messages, {"role": "assistant", "content": "<move>4</move>"}, answer], random.Random(0))
    assert read_move(reply, "....O....", FORMAT).cell is not None  # once rejected, the teacher's move
    with pytest.raises(ValueError, match="mistake_prob must be a number in"):
        ttt.recovering(ttt.teacher_player, 1.5)


def test_heuristic_wins_before_it_blocks_and_blocks_when_it_must() -> None:
    rng = random.Random(0)
    assert ttt.heuristic_move("XX.OO....", "X", rng).cell == 2  # its own win first
    assert ttt.heuristic_move("X...OO...", "X", rng).cell == 3  # then O's threat
    move = ttt.heuristic_move("OO..X....", "X", rng)
    assert move.cell == 2 and "block" in move.reason


def test_heuristic_falls_for_forks() -> None:
    board = "O...X...O"  # X to move: only an edge stops O's fork; the heuristic may take a corner
    chosen = cells_chosen(ttt.heuristic_move, board)
    assert {2, 6} & chosen
    assert all(value(play(board, c, "X"), "O") == 1 for c in {2, 6} & chosen)  # O then wins by force


def test_scripted_players_read_the_last_board_and_reply_in_the_env_format() -> None:
    messages = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": turn_message("New game.", EMPTY_BOARD)},
        {"role": "assistant", "content": "<move>0</move>"},
        {"role": "user", "content": turn_message(opponent_event(4), "X...O....")},
    ]
    for policy in (ttt.random_player, ttt.optimal_player, ttt.heuristic_player, ttt.noisy_player(0.3)):
        reply = policy(messages, random.Random(1))
        assert FORMAT.format_score(reply) == 1.0
        assert reply.startswith("<think>") and reply.count("\n") == 1
        verdict = read_move(reply, "X...O....", FORMAT)
        assert verdict.cell is not None, reply
    reply = ttt.optimal_player(messages, random.Random(1))
    assert read_move(reply, "X...O....", FORMAT).cell in optimal_moves("X...O....", "X")


def test_scripted_players_name_the_policy_for_the_cli() -> None:
    assert ttt.optimal_player.__name__ == "optimal_player"
    assert ttt.noisy_player(0.25).__name__ == "noisy_player_0.25"


def test_a_conversation_without_a_board_is_an_error() -> None:
    with pytest.raises(ValueError, match="shows no tic-tac-toe board"):
        ttt.optimal_player([{"role": "user", "content": "hello"}], random.Random(0))
    with pytest.raises(ValueError, match="no user message"):
        ttt.optimal_player([{"role": "system", "content": "rules"}], random.Random(0))
