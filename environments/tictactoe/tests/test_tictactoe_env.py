"""The environment end to end with scripted models: episodes, invalid moves, seeding, curriculum,
rewards and metrics, the talk's first version, and argument checks."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import tictactoe as ttt
from tictactoe.game import free_cells, parse_board, play

import palaestra as pa
from palaestra.cli import main
from palaestra.data import band_edges

Policy = Callable[[pa.Messages, random.Random], str]


async def play_example(env: ttt.TicTacToeEnv, policy: Policy, index: int, **kwargs: int) -> pa.Rollout:
    """One scored rollout of example ``index``."""
    example = env.examples[index]
    rollout = await env.rollout(pa.ScriptedClient(policy), example, **kwargs)
    await env.rubric.score_group([rollout], [example])
    assert rollout.error is None, rollout.error
    return rollout


def replies_then(first: Callable[[str], str], then: Policy = ttt.optimal_player) -> Policy:
    """Say ``first(board)`` on the first turn, then play ``then``."""

    def policy(messages: pa.Messages, rng: random.Random) -> str:
        if not any(m["role"] == "assistant" for m in messages):
            return first(ttt.players.board_from_messages(messages))
        return then(messages, rng)

    return policy


def lowest_free_cell(messages: pa.Messages) -> str:
    """A deterministic model: always the lowest free cell."""
    return f"<think>lowest</think><move>{free_cells(ttt.players.board_from_messages(messages))[0]}</move>"


@pytest.fixture(scope="module")
def env() -> ttt.TicTacToeEnv:
    return ttt.load_environment(num_examples=40, opponent="optimal")


@pytest.fixture(scope="module")
def o_starts(env: ttt.TicTacToeEnv) -> int:
    """An example where the opponent made the first move."""
    return next(i for i, e in enumerate(env.examples) if not e.row["model_starts"])


def test_the_first_message_shows_the_opening_board(env: ttt.TicTacToeEnv, o_starts: int) -> None:
    example = env.examples[o_starts]
    board = example.row["start_board"]
    assert board.count("O") == 1 and "X" not in board
    assert example.prompt[0]["role"] == "system" and "<think>" in example.prompt[0]["content"]
    text = example.prompt[-1]["content"]
    assert f"moved first and played cell {board.index('O')}" in text
    assert parse_board(text) == board
    assert "Free cells: " in text
    starts = [e for e in env.examples if e.row["model_starts"]]
    assert all(
        e.row["start_board"] == "........." and "you move first" in e.prompt[-1]["content"] for e in starts
    )


def test_who_starts_is_a_fair_draw_from_each_example_seed() -> None:
    rows = ttt.make_dataset(
        1000, min_random_move_prob=0.0, max_random_move_prob=1.0, num_groups=1, seed=0, variant="standard"
    )
    assert 430 < sum(row["model_starts"] for row in rows) < 570
    assert len({row["example_seed"] for row in rows}) == 1000


INVALID_REPLIES = {
    "no tag": (lambda board: "I will take the centre.", "has no <move>"),
    "unclosed tag": (lambda board: "<think>hm</think><move>4", "has no <move>"),
    "empty tag": (lambda board: "<think>hm</think><move></move>", "the <move> tag is empty"),
    "empty reply": (lambda board: "", "has no <move>"),
    "occupied cell": (lambda board: f"<move>{board.index('O')}</move>", "is already taken by O"),
    "out of range": (lambda board: "<move>9</move>", "there is no cell 9"),
    "two digits": (lambda board: "<move>12</move>", "there is no cell 12"),
    "negative": (lambda board: "<move>-1</move>", "there is no cell -1"),
    "4.": (lambda board: "<move>4.</move>", "'4.' is not a cell number"),
    "a word": (lambda board: "<move>centre</move>", "'centre' is not a cell number"),
    "latest of two is taken": (
        lambda board: f"<move>{free_cells(board)[0]}</move> no, <move>{board.index('O')}</move>",
        "is already taken",
    ),
    "1 MB of text": (lambda board: "blah " * 200_000, "has no <move>"),
    "1 MB in the tag": (lambda board: "<move>" + "7" * 1_000_000 + "</move>", "there is no cell 777"),
}


@pytest.mark.parametrize("kind", list(INVALID_REPLIES))
async def test_an_invalid_reply_is_explained_and_the_game_goes_on(
    env: ttt.TicTacToeEnv, o_starts: int, kind: str
) -> None:
    reply, reason = INVALID_REPLIES[kind]
    start = env.examples[o_starts].row["start_board"]
    r = await play_example(env, replies_then(reply), o_starts)
    feedback = r.completion[1]["content"]
    assert feedback.startswith("Invalid move: ") and reason in feedback
    assert "your opponent has not moved" in feedback
    assert len(feedback) < 1000  # a huge reply is not echoed back
    assert parse_board(feedback) == start  # the board is unchanged
    assert r.state["moves"][:2] == [f"O{start.index('O')}", r.state["moves"][1]]
    assert r.state["moves"][1].startswith("X")  # the opponent did not move after the invalid reply
    assert r.state["invalid_moves"] == 1 and r.metrics["invalid_moves"] == 1.0
    assert r.metrics["had_invalid_move"] == 1.0 and r.metrics["invalid_move_penalty"] == -0.1
    assert r.state["outcome"] == "draw" and r.stop_reason == "game_over"  # the game went on to its end
    turns = r.metrics["turns"]
    first_in_format = env.parser.format_score(r.completion[0]["content"]) == 1.0  # "<move></move>" is
    assert r.reward == pytest.approx(0.5 + 0.2 * (turns - 1 + first_in_format) / turns - 0.1)


async def test_the_latest_move_counts_when_a_reply_has_two(env: ttt.TicTacToeEnv, o_starts: int) -> None:
    def two_moves(board: str) -> str:
        first, last = free_cells(board)[0], free_cells(board)[-1]
        return f"<think>t</think><move>{first}</move> or rather <move>{last}</move>"

    r = await play_example(env, replies_then(two_moves), o_starts)
    start = env.examples[o_starts].row["start_board"]
    assert r.state["moves"][1] == f"X{free_cells(start)[-1]}"
    assert r.state["invalid_moves"] == 0


async def test_only_the_newest_reply_is_read(env: ttt.TicTacToeEnv, o_starts: int) -> None:
    start = env.examples[o_starts].row["start_board"]
    cell = ttt.optimal_moves(start, "X")[0]
    answers = iter([f"<move>{cell}</move>", "I already told you my move."])

    def policy(messages: pa.Messages, rng: random.Random) -> str:
        return next(answers, None) or ttt.optimal_player(messages, rng)

    r = await play_example(env, policy, o_starts)
    assert r.state["invalid_moves"] == 1  # the second reply's missing move is not the first one again
    assert r.completion[3]["content"].startswith("Invalid move: your reply has no <move>")


async def test_every_reply_counts_up_to_the_turn_cap() -> None:
    env = ttt.load_environment(num_examples=2, max_turns=8)
    r = await play_example(env, lambda messages, rng: "no idea", 0)
    assert r.stop_reason == "max_turns" and r.state["outcome"] == "unfinished"
    assert r.state["invalid_moves"] == 8  # the last reply before the cap is read too
    assert r.metrics["unfinished"] == 1.0 and r.metrics["turns"] == 8
    assert r.reward == pytest.approx(-0.1)
    capped = ttt.load_environment(num_examples=2, max_turns=1)
    r = await play_example(capped, lowest_free_cell, 0)
    assert r.stop_reason == "max_turns" and r.state["moves"][-2].startswith("X")  # applied, then capped


async def test_same_moves_meet_the_same_opponent_replies() -> None:
    env = ttt.load_environment(num_examples=10, min_random_move_prob=0.5, max_random_move_prob=0.5)
    first = await play_example(env, lambda messages: lowest_free_cell(messages), 3, rollout_index=0, seed=0)
    again = await play_example(env, lambda messages: lowest_free_cell(messages), 3, rollout_index=5, seed=9)
    assert first.completion == again.completion and first.state["moves"] == again.state["moves"]


async def test_the_same_position_gets_the_same_reply_within_an_example() -> None:
    env = ttt.load_environment(num_examples=4, min_random_move_prob=0.5, max_random_move_prob=0.5)
    replies: dict[tuple[int, str], set[str]] = {}
    for index in range(4):
        for rollout_index in range(25):
            r = await play_example(env, ttt.random_player, index, rollout_index=rollout_index)
            board = "........."
            for previous, move in zip([None, *r.state["moves"]], r.state["moves"], strict=False):
                if move[0] == "O" and previous is not None:
                    replies.setdefault((index, board), set()).add(move)
                board = play(board, int(move[1]), "X" if move[0] == "X" else "O")
    assert all(len(seen) == 1 for seen in replies.values())
    # examples differ: a position reached in two examples may get different replies
    by_position: dict[str, set[str]] = {}
    for (_, board), seen in replies.items():
        by_position.setdefault(board, set()).update(seen)
    assert any(len(seen) > 1 for seen in by_position.values())


async def test_the_same_seed_gives_the_same_dataset_and_games() -> None:
    a, b = ttt.load_environment(num_examples=30, seed=5), ttt.load_environment(num_examples=30, seed=5)
    assert [e.row for e in a.examples] == [e.row for e in b.examples]
    assert [e.row for e in a.examples] != [
        e.row for e in ttt.load_environment(num_examples=30, seed=6).examples
    ]
    runs = [await env.run(pa.ScriptedClient(ttt.random_player), pa.RunSpec(seed=1)) for env in (a, b)]
    assert [r.completion for r in runs[0]] == [r.completion for r in runs[1]]


def test_opponent_randomness_is_stratified_over_its_range() -> None:
    env = ttt.load_environment(
        num_examples=60, min_random_move_prob=0.2, max_random_move_prob=0.7, num_groups=5
    )
    probs = [e.row["random_move_prob"] for e in env.examples]
    edges = band_edges(0.2, 0.7, 5)
    bands = [next(b for b, (lo, hi) in enumerate(edges) if lo <= p <= hi) for p in probs]
    for i in range(len(bands) - 4):
        assert sorted(bands[i : i + 5]) == [0, 1, 2, 3, 4], f"window at {i}"


def test_opponent_shorthands_fix_the_randomness() -> None:
    assert {
        e.row["random_move_prob"] for e in ttt.load_environment(num_examples=9, opponent="optimal").examples
    } == {0.0}
    assert {
        e.row["random_move_prob"] for e in ttt.load_environment(num_examples=9, opponent="random").examples
    } == {1.0}
    env = ttt.load_environment(num_examples=9, opponent="optimal", min_random_move_prob=0.0)
    assert {e.row["random_move_prob"] for e in env.examples} == {0.0}


async def test_rewards_and_metrics_of_a_win_a_draw_and_a_loss() -> None:
    env = ttt.load_environment(num_examples=30, opponent="random")
    wins = [r for r in await env.run(pa.ScriptedClient(ttt.optimal_player)) if r.state["outcome"] == "win"]
    assert wins and all(r.reward == pytest.approx(1.2) for r in wins)
    assert all(r.metrics["won"] == 1.0 and r.metrics["drew"] == r.metrics["lost"] == 0.0 for r in wins)
    env = ttt.load_environment(num_examples=30, opponent="optimal")
    rollouts = await env.run(pa.ScriptedClient(ttt.random_player))
    losses = [r for r in rollouts if r.state["outcome"] == "loss"]
    assert losses and all(r.reward == pytest.approx(0.2) and r.metrics["lost"] == 1.0 for r in losses)
    assert set(rollouts[0].metrics) == {
        "win_reward",
        "format_reward",
        "invalid_move_penalty",
        "won",
        "drew",
        "lost",
        "unfinished",
        "invalid_moves",
        "had_invalid_move",
        "turns",
    }


def always_taken(messages: pa.Messages, rng: random.Random) -> str:
    """A model that stalls: every reply names an occupied cell (or none, on an empty board)."""
    board = ttt.players.board_from_messages(messages)
    taken = [i for i, c in enumerate(board) if c != "."]
    return f"<think>t</think><move>{taken[0] if taken else 'x'}</move>"


def one_invalid_then(player: Policy) -> Policy:
    return replies_then(lambda board: "<think>t</think><move>9</move>", player)


async def test_talk_rewards_make_every_invalid_move_after_the_first_free() -> None:
    """The spec's default: stalling to the cap scores what a legal loss with one invalid move does."""
    env = ttt.load_environment(num_examples=20, opponent="optimal")
    stall = await play_example(env, always_taken, 0)
    assert stall.state["outcome"] == "unfinished" and stall.metrics["invalid_moves"] == 8
    assert stall.metrics["invalid_move_penalty"] == -0.1 and stall.metrics["win_reward"] == 0.0
    loss = await play_example(env, one_invalid_then(ttt.random_player), 0)
    assert loss.state["outcome"] == "loss" and loss.metrics["invalid_moves"] == 1
    assert stall.reward == pytest.approx(loss.reward) == pytest.approx(0.1)


async def test_strict_rewards_charge_every_invalid_move_and_an_unfinished_game() -> None:
    env = ttt.load_environment(num_examples=20, opponent="optimal", rewards="strict")
    stall = await play_example(env, always_taken, 0)
    assert stall.metrics["invalid_move_penalty"] == pytest.approx(-0.8)
    assert stall.metrics["win_reward"] == -0.5 and stall.reward == pytest.approx(-0.5 + 0.2 - 0.8)
    loss = await play_example(env, one_invalid_then(ttt.random_player), 0)
    assert loss.reward == pytest.approx(0.2 - 0.1)
    legal_loss = await play_example(env, ttt.random_player, 0)
    assert legal_loss.state["outcome"] == "loss" and legal_loss.reward == pytest.approx(0.2)
    assert stall.reward < loss.reward < legal_loss.reward  # every invalid move costs; stalling most
    draw = await play_example(env, ttt.optimal_player, 0)
    assert draw.reward == pytest.approx(0.7)  # a clean game scores as under the talk's rules


async def test_reward_numbers_can_be_set_and_are_checked() -> None:
    env = ttt.load_environment(
        num_examples=4, opponent="optimal", rewards="strict", invalid_move_penalty=0.25, unfinished_reward=-1
    )
    stall = await play_example(env, always_taken, 0)
    assert stall.metrics["invalid_move_penalty"] == pytest.approx(-2.0) and stall.metrics["win_reward"] == -1
    flat = ttt.load_environment(num_examples=4, opponent="optimal", invalid_move_penalty=0.3)
    assert (await play_example(flat, always_taken, 0)).metrics["invalid_move_penalty"] == pytest.approx(-0.3)
    heavy = ttt.load_environment(num_examples=4, opponent="optimal", format_weight=1.0)
    draw = await play_example(heavy, ttt.optimal_player, 0)
    assert draw.metrics["format_reward"] == 1.0 and draw.reward == pytest.approx(0.5 + 1.0)
    for bad, match in (
        ({"rewards": "lenient"}, "rewards must be one of talk, strict"),
        ({"invalid_move_penalty": -0.1}, "invalid_move_penalty must be a number in"),
        ({"unfinished_reward": float("nan")}, "unfinished_reward must be a number"),
        ({"unfinished_reward": True}, "unfinished_reward must be a number"),
        ({"format_weight": 11}, "format_weight must be a number in"),
    ):
        with pytest.raises(ValueError, match=match):
            ttt.load_environment(num_examples=4, **bad)


async def test_format_is_the_share_of_replies_with_think_then_move() -> None:
    env = ttt.load_environment(num_examples=6, opponent="optimal")

    def no_think(messages: pa.Messages, rng: random.Random) -> str:
        reply = ttt.optimal_player(messages, rng)
        return reply.split("\n")[-1] if len(messages) < 4 else reply  # first reply: move only

    r = await play_example(env, no_think, 0)
    turns = r.metrics["turns"]
    assert r.metrics["format_reward"] == pytest.approx((turns - 1) / turns)
    assert r.state["invalid_moves"] == 0 and r.state["outcome"] == "draw"


async def test_protocol_optimal_draws_every_game_and_random_loses_most() -> None:
    env = ttt.load_environment(num_examples=100, opponent="optimal")
    optimal = await env.run(pa.ScriptedClient(ttt.optimal_player))
    assert [r.state["outcome"] for r in optimal] == ["draw"] * 100
    assert all(r.reward == pytest.approx(0.7) for r in optimal)
    randoms = await env.run(pa.ScriptedClient(ttt.random_player))
    assert sum(r.metrics["lost"] for r in randoms) > 75
    assert sum(r.metrics["won"] for r in randoms) == 0


async def test_talk_v1_rules_model_starts_random_opponent_invalid_move_loses() -> None:
    env = ttt.load_environment(num_examples=20, variant="talk_v1")
    assert all(e.row["model_starts"] and e.row["random_move_prob"] == 1.0 for e in env.examples)
    assert "<think>" not in env.system_prompt and "loses the game" in env.system_prompt
    assert "invalid_move_penalty" not in env.rubric.names
    r = await play_example(env, replies_then(lambda board: "The centre!"), 0)
    assert r.metrics["turns"] == 1 and r.state["outcome"] == "loss" and r.stop_reason == "game_over"
    assert r.reward == 0.0 and r.metrics["invalid_moves"] == 1.0 and len(r.completion) == 2
    assert "You lose." in r.completion[-1]["content"]  # the closing message says why the game ended

    def move_only(messages: pa.Messages, rng: random.Random) -> str:
        return ttt.optimal_player(messages, rng).split("\n")[-1]

    rollouts = await env.run(pa.ScriptedClient(move_only))
    assert all(r.metrics["format_reward"] == 1.0 for r in rollouts)
    assert all(r.reward == pytest.approx({"win": 1.2, "draw": 0.7}[r.state["outcome"]]) for r in rollouts)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_examples": 0}, "num_examples must be an integer ≥ 1"),
        ({"num_examples": True}, "num_examples must be an integer"),
        ({"max_turns": 0}, "max_turns must be an integer ≥ 1"),
        ({"num_groups": 0}, "num_groups must be an integer ≥ 1"),
        ({"num_examples": 3, "num_groups": 4}, r"num_groups \(4\) cannot exceed num_examples \(3\)"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"min_random_move_prob": -0.1}, r"min_random_move_prob must be a number in \[0, 1\]"),
        ({"max_random_move_prob": 2}, r"max_random_move_prob must be a number in \[0, 1\]"),
        ({"max_random_move_prob": "1"}, "max_random_move_prob must be a number"),
        ({"min_random_move_prob": 0.8, "max_random_move_prob": 0.2}, r"min_random_move_prob \(0.8\) exceeds"),
        ({"opponent": "perfect"}, "opponent must be 'optimal' or 'random'"),
        (
            {"opponent": "optimal", "max_random_move_prob": 0.5},
            "opponent='optimal' means max_random_move_prob=0.0",
        ),
        (
            {"opponent": "random", "min_random_move_prob": 0.0},
            "opponent='random' means min_random_move_prob=1.0",
        ),
        ({"variant": "v3"}, "variant must be one of standard, talk_v1"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ttt.load_environment(**kwargs)


def test_load_through_the_registry() -> None:
    env = pa.load_environment("tictactoe", num_examples=5, opponent="random")
    assert isinstance(env, ttt.TicTacToeEnv) and len(env.examples) == 5


@pytest.mark.parametrize("opponent", ["optimal", "random"])
def test_cli_eval_runs_the_protocol_and_shows_wdl(
    opponent: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "eval",
        "tictactoe",
        "-m",
        "scripted:tictactoe:optimal_player",
        "-a",
        f'{{"opponent": "{opponent}"}}',
    ]
    assert main([*args, "-o", str(tmp_path), "--quiet"]) == 0
    rows = {
        line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.strip()
    }
    assert rows["drew"][-1] == "100"  # the protocol's 100 games, one rollout each
    for metric in ("won", "drew", "lost", "unfinished", "format_reward", "had_invalid_move"):
        assert metric in rows
    assert rows["format_reward"][0] == "1.000" and rows["had_invalid_move"][0] == "0.000"
    assert rows["lost"][0] == "0.000"
    if opponent == "optimal":
        assert rows["drew"][0] == "1.000"
