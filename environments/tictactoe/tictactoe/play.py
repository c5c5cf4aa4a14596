"""``palaestra play tictactoe``: a person plays O against the model, in the terminal.

The model is X and is asked with exactly the environment's prompts; its invalid replies are
handled as in the environment (told why and asked again, up to ``max_turns`` replies; under
``talk_v1`` an invalid move loses at once). Who starts is drawn from ``seed``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

import palaestra as pa
from tictactoe.game import EMPTY_BOARD, FREE, free_cells, play
from tictactoe.protocol import (
    Outcome,
    invalid_event,
    opening_event,
    opponent_event,
    read_move,
    result,
    turn_message,
)

if TYPE_CHECKING:
    from tictactoe.env import TicTacToeEnv

_CELL = re.compile(r"[0-9]{1,3}")
_STYLE = {"X": "bold cyan", "O": "bold magenta"}
RESULT_LINES = {
    "win": "Result: the model wins.",
    "draw": "Result: a draw.",
    "loss": "Result: you win!",
    "unfinished": "Result: unfinished (the model ran out of turns).",
}


def board_table(board: str) -> Table:
    """The board as a Rich grid: X and O in colour, free cells as their dimmed numbers."""
    table = Table(show_header=False, show_lines=True, box=box.SQUARE, padding=(0, 1))
    for _ in range(3):
        table.add_column(justify="center", width=1)
    for row in range(3):
        cells = [board[i] if board[i] != FREE else str(i) for i in range(row * 3, row * 3 + 3)]
        table.add_row(*(Text(c, style=_STYLE.get(c, "dim")) for c in cells))
    return table


def cell_problem(text: str, board: str) -> tuple[int | None, str | None]:
    """The person's input as a cell, or why it is not a free one."""
    raw = text.strip()
    if not raw:
        return None, "type the number of a free cell"
    if not _CELL.fullmatch(raw):
        return None, f"{raw[:20]!r} is not a cell number"
    cell = int(raw)
    if cell > 8:
        return None, f"there is no cell {cell}: cells are 0 to 8"
    if board[cell] != FREE:
        return None, f"cell {cell} is already taken by {board[cell]}"
    return cell, None


def ask_cell(board: str, ask: Callable[[str], str], console: Console) -> int:
    """Ask until the person names a free cell. ``ask`` blocks: here the person is all there is."""
    while True:
        cell, problem = cell_problem(ask("Your move (cell number): "), board)
        if cell is not None:
            return cell
        free = " ".join(map(str, free_cells(board)))
        console.print(f"[red]Not a move: {escape(str(problem))}.[/red] Free cells: {free}")


def show(console: Console, board: str) -> None:
    console.print(board_table(board))
    console.print(f"Free cells: {' '.join(map(str, free_cells(board))) or 'none'}")


async def play_game(
    env: TicTacToeEnv,
    client: pa.ModelClient,
    *,
    console: Console,
    ask: Callable[[str], str],
    sampling: pa.Sampling,
    seed: int,
    show_thinking: bool,
) -> Outcome:
    """Play one game; print the board after every move and the result; return the model's outcome."""
    person_starts = (
        env.variant != "talk_v1" and random.Random(pa.derive_seed("tictactoe/play", seed)).random() < 0.5
    )
    console.print(
        f"Tic-tac-toe: you are [bold magenta]O[/bold magenta], the model "
        f"({escape(client.model)}) is [bold cyan]X[/bold cyan]. "
        + ("You move first." if person_starts else "The model moves first.")
    )
    board, opening = EMPTY_BOARD, None
    if person_starts:
        show(console, board)
        opening = ask_cell(board, ask, console)
        board = play(board, opening, "O")
    messages: pa.Messages = [
        {"role": "system", "content": env.system_prompt or ""},
        {"role": "user", "content": turn_message(opening_event(opening), board)},
    ]
    outcome: Outcome | None = None
    replies = 0
    while outcome is None:
        if replies >= env.max_turns:
            outcome = "unfinished"
            break
        try:
            response = await client.chat(
                list(messages), sampling=sampling.replace(seed=pa.derive_seed(seed, "play", replies))
            )
        except pa.ModelError as exc:
            console.print(f"[red]The model failed: {escape(str(exc))}[/red]")
            return "unfinished"
        replies += 1
        messages.append(response.message)
        text = response.content
        if show_thinking:
            thought = pa.ThinkParser().think(text)
            if thought:
                console.print(Text(f"model thinks: {thought}", style="italic dim"))
        verdict = read_move(text, board, env.parser)
        if verdict.cell is None:
            console.print(
                f"[yellow]The model's reply is not a valid move: {escape(str(verdict.problem))}.[/yellow]"
            )
            if env.variant == "talk_v1":
                outcome = "loss"
                break
            messages.append(
                {"role": "user", "content": turn_message(invalid_event(str(verdict.problem)), board)}
            )
            continue
        board = play(board, verdict.cell, "X")
        console.print(f"The model plays [bold cyan]{verdict.cell}[/bold cyan].")
        outcome = result(board)
        if outcome is not None:
            break
        show(console, board)
        cell = ask_cell(board, ask, console)
        board = play(board, cell, "O")
        outcome = result(board)
        messages.append({"role": "user", "content": turn_message(opponent_event(cell), board)})
    console.print(board_table(board))
    console.print(f"[bold]{RESULT_LINES[outcome]}[/bold]")
    return outcome
