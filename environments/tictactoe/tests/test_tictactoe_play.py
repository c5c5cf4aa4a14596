"""``palaestra play tictactoe``: a person plays O against the model in the terminal.

Tested as a person would use it, through a pseudo-terminal (pexpect), and directly with a
scripted ``ask`` that reads the screen like a person does.
"""

from __future__ import annotations

import io
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import tictactoe as ttt
from rich.console import Console
from tictactoe.solver import optimal_moves

import palaestra as pa

PALAESTRA = Path(sys.executable).parent / "palaestra"
FREE_LINE = re.compile(r"Free cells: ([0-9 ]+)")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def free_on_screen(screen: str) -> list[int]:
    """The free cells of the last board shown."""
    return [int(c) for c in FREE_LINE.findall(screen)[-1].split()]


def next_input(bad: list[str], free: list[int], choose: Callable[[list[int]], int]) -> str:
    """The next bad input to try, else a move. ``<taken>`` waits until some cell is taken."""
    taken = [c for c in range(9) if c not in free]
    if bad and (bad[0] != "<taken>" or taken):
        typed = bad.pop(0)
        return str(taken[0]) if typed == "<taken>" else typed
    return str(choose(free))


class Person:
    """Reads the screen and types: first some bad input, then ``choose(free cells)``."""

    def __init__(
        self, screen: io.StringIO, choose: Callable[[list[int]], int], bad: tuple[str, ...] = ()
    ) -> None:
        self.screen, self.choose, self.bad = screen, choose, list(bad)
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return next_input(self.bad, free_on_screen(self.screen.getvalue()), self.choose)


async def play(
    policy: Callable[..., str],
    person: Callable[[io.StringIO], Person],
    *,
    seed: int = 0,
    show_thinking: bool = False,
    **env_args: str | int,
) -> tuple[str, str]:
    """One game; returns (the model's outcome, the screen)."""
    screen = io.StringIO()
    env = ttt.load_environment(num_examples=1, **env_args)
    outcome = await env.play_interactive(
        pa.ScriptedClient(policy),
        console=Console(file=screen, width=100, color_system=None),
        ask=person(screen),
        sampling=pa.Sampling(),
        seed=seed,
        show_thinking=show_thinking,
    )
    return outcome, screen.getvalue()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
async def test_a_person_at_best_draws_against_the_optimal_model(seed: int) -> None:
    bad = ("abc", "", "9", "<taken>")
    outcome, screen = await play(
        ttt.optimal_player, lambda s: Person(s, lambda free: free[0], bad), seed=seed
    )
    assert outcome in ("win", "draw")
    assert "'abc' is not a cell number" in screen and "type the number of a free cell" in screen
    assert "there is no cell 9: cells are 0 to 8" in screen and "is already taken by" in screen
    assert "┌───┬───┬───┐" in screen and "│ X │" in screen
    assert screen.rstrip().endswith({"win": "Result: the model wins.", "draw": "Result: a draw."}[outcome])


async def test_a_person_who_plays_well_beats_a_weak_model() -> None:
    def lowest(messages: pa.Messages) -> str:
        return f"<move>{ttt.free_cells(ttt.players.board_from_messages(messages))[0]}</move>"

    def best_o(screen: io.StringIO) -> Person:
        def choose(free: list[int]) -> int:  # read the last board drawn, play a best move for O
            rows = re.findall(r"│ ([XO0-8]) │ ([XO0-8]) │ ([XO0-8]) │", screen.getvalue())[-3:]
            board = "".join(c if c in "XO" else "." for row in rows for c in row)
            return optimal_moves(board, "O")[0]

        return Person(screen, choose)

    outcome, screen = await play(lowest, best_o, seed=0)
    assert outcome == "loss" and "Result: you win!" in screen


async def test_the_model_is_asked_with_the_environments_prompts() -> None:
    requests: list[pa.Messages] = []
    replies = iter(["<move>nine</move>"])

    def model(messages: pa.Messages, rng: random.Random) -> str:
        requests.append(messages)
        return next(replies, None) or ttt.optimal_player(messages, rng)

    outcome, screen = await play(model, lambda s: Person(s, lambda free: free[-1]), seed=0)
    env = ttt.load_environment(num_examples=1)
    assert requests[0][0] == {"role": "system", "content": env.system_prompt}
    assert requests[0][1]["content"].startswith("New game. You play X")
    assert requests[1][-1]["content"].startswith("Invalid move: 'nine' is not a cell number")
    assert "The model's reply is not a valid move: 'nine' is not a cell number" in screen
    assert outcome in ("win", "draw")


async def test_a_model_that_never_makes_a_move_runs_out_of_turns() -> None:
    outcome, screen = await play(
        lambda messages: "I pass.", lambda s: Person(s, lambda free: free[0]), max_turns=3
    )
    assert outcome == "unfinished"
    assert screen.count("not a valid move: your reply has no <move>") == 3
    assert "Result: unfinished (the model ran out of turns)." in screen


async def test_under_talk_v1_an_invalid_reply_loses_at_once() -> None:
    outcome, screen = await play(
        lambda messages: "<move>4.</move>", lambda s: Person(s, lambda free: free[0]), variant="talk_v1"
    )
    assert outcome == "loss" and "The model moves first." in screen and "Result: you win!" in screen


@pytest.mark.parametrize("show_thinking", [True, False])
async def test_thinking_is_shown_only_when_asked(show_thinking: bool) -> None:
    _, screen = await play(
        ttt.heuristic_player, lambda s: Person(s, lambda free: free[0]), show_thinking=show_thinking
    )
    assert ("model thinks:" in screen) is show_thinking


async def test_end_of_input_propagates_to_the_caller() -> None:
    def closed(prompt: str) -> str:
        raise EOFError

    env = ttt.load_environment(num_examples=1)
    with pytest.raises(EOFError):
        for seed in range(10):  # whoever starts, the person is asked within two turns
            await env.play_interactive(
                pa.ScriptedClient(ttt.optimal_player),
                console=Console(file=io.StringIO()),
                ask=closed,
                seed=seed,
            )


def test_cli_play_through_a_terminal() -> None:
    """Type bad input, then legal moves, into `palaestra play`; the optimal model never loses."""
    pexpect = pytest.importorskip("pexpect", reason="the terminal test needs pexpect (a dev extra)")
    child = pexpect.spawn(
        str(PALAESTRA),
        ["play", "tictactoe", "-m", "scripted:tictactoe:optimal_player", "--show-thinking", "--seed", "3"],
        encoding="utf-8",
        timeout=30,
        dimensions=(50, 100),
        env={"PATH": "/usr/bin:/bin", "TERM": "xterm", "NO_COLOR": "1"},
    )
    screen, bad = "", ["abc", "42", "<taken>"]
    while True:
        found = child.expect([r"Your move \(cell number\): ", r"Result: ([^\r\n]+)"])
        screen += ANSI.sub("", child.before + child.after)  # what the person sees
        if found == 1:
            final = ANSI.sub("", child.match.group(1)).strip()
            break
        child.sendline(next_input(bad, free_on_screen(screen), lambda free: free[0]))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "you are O, the model (scripted:tictactoe:optimal_player) is X" in screen
    assert "┌───┬───┬───┐" in screen and "model thinks:" in screen
    assert "'abc' is not a cell number" in screen and "there is no cell 42" in screen
    assert "is already taken by" in screen
    assert final in ("the model wins.", "a draw.")


async def test_a_model_failure_ends_the_game_with_a_message() -> None:
    class Broken:
        model = "broken"

        async def chat(self, messages: pa.Messages, **kwargs: object) -> pa.ModelResponse:
            raise pa.ModelHTTPError(500, "server down")

    screen = io.StringIO()
    env = ttt.load_environment(num_examples=1)
    person = Person(screen, lambda free: free[0])
    outcome = await env.play_interactive(
        Broken(), console=Console(file=screen, width=100), ask=person, seed=0
    )
    assert outcome == "unfinished" and "The model failed: HTTP 500: server down" in screen.getvalue()
