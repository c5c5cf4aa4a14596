"""TicTacToeEnv and ``load_environment``: the reference game of the talk "Let LLMs Wander" as a palaestra env.

Per example: a seed (``derive_seed("tictactoe/example", seed, i)``), who starts (50/50 from that
seed; the opponent's opening is already in the first message), and the opponent's
``random_move_prob``, stratified over its range so any ``num_groups`` consecutive examples span
every band. Each opponent move comes from an rng seeded by (example seed, board): two rollouts
of one example that reach the same position get the same reply.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import palaestra as pa
from palaestra.checks import check_choice, check_int, check_number
from palaestra.data import stratified_values
from tictactoe.game import EMPTY_BOARD, play
from tictactoe.players import Move, noisy
from tictactoe.protocol import (
    VARIANTS,
    Outcome,
    Variant,
    game_over_message,
    invalid_event,
    opening_event,
    opponent_event,
    read_move,
    result,
    system_prompt,
    turn_message,
)
from tictactoe.rubric import REWARD_RULES, RewardRules, make_rubric

if TYPE_CHECKING:
    from rich.console import Console

OPPONENTS = {"optimal": 0.0, "random": 1.0}  # shorthands: both ends of the range at this value


def opponent_move(board: str, example_seed: int, random_move_prob: float) -> Move:
    """O's reply on ``board``: the same for the same (example, position), whatever came before."""
    rng = random.Random(pa.derive_seed("tictactoe/opponent", example_seed, board))
    return noisy(random_move_prob)(board, "O", rng)


def make_dataset(
    num_examples: int,
    *,
    min_random_move_prob: float,
    max_random_move_prob: float,
    num_groups: int,
    seed: int,
    variant: Variant,
) -> list[dict[str, Any]]:
    """The rows: first user message, example seed, opponent randomness, who starts, start board."""
    probs = stratified_values(
        num_examples,
        min_random_move_prob,
        max_random_move_prob,
        num_groups=num_groups,
        seed=pa.derive_seed("tictactoe/random_move_prob", seed),
    )
    rows = []
    for i, prob in enumerate(probs):
        example_seed = pa.derive_seed("tictactoe/example", seed, i)
        starts = random.Random(pa.derive_seed("tictactoe/starts", example_seed)).random() < 0.5
        model_starts = variant == "talk_v1" or starts
        board, opening = EMPTY_BOARD, None
        if not model_starts:
            opening = opponent_move(board, example_seed, prob).cell
            board = play(board, opening, "O")
        rows.append(
            {
                "question": turn_message(opening_event(opening), board),
                "example_seed": example_seed,
                "random_move_prob": prob,
                "model_starts": model_starts,
                "start_board": board,
            }
        )
    return rows


class TicTacToeEnv(pa.MultiTurnEnv):
    """The model plays X against a seeded opponent, one move per reply.

    ``env_response`` plays the model's move (or counts it invalid) and the opponent's reply, and
    ends the episode with ``Final(..., reason="game_over")`` when the game is decided. It answers
    the reply that reaches ``max_turns`` too, so a last winning move still counts. ``state`` keeps
    ``board``, ``outcome`` ("win", "draw", "loss" or "unfinished"), ``invalid_moves`` and
    ``moves`` (like ``["O4", "X0", ...]``).
    """

    def __init__(self, *, variant: Variant = "standard", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.variant: Variant = variant

    async def setup_state(self, state: pa.State) -> None:
        row = state.example.row
        state["board"] = row["start_board"]
        state["outcome"] = "unfinished"
        state["invalid_moves"] = 0
        state["moves"] = [f"O{cell}" for cell, c in enumerate(row["start_board"]) if c == "O"]
        state["example_seed"] = row["example_seed"]
        state["random_move_prob"] = row["random_move_prob"]
        state["model_starts"] = row["model_starts"]

    async def env_response(self, messages: pa.Messages, state: pa.State) -> pa.Messages | pa.Final:
        text = self.apply_reply(messages[-1], state)
        reply = [{"role": "user", "content": text}]
        return pa.Final(reply, reason="game_over") if state["outcome"] != "unfinished" else reply

    def apply_reply(self, message: pa.Message, state: pa.State) -> str:
        """Play the move in ``message`` (or count it invalid), then the opponent's reply.

        Returns the next message to the model: what happened and the board, or the result.
        """
        text = self.parser.assistant_texts([message])[0] if message.get("role") == "assistant" else ""
        board = state["board"]
        verdict = read_move(text, board, self.parser)
        if verdict.cell is None:
            state["invalid_moves"] += 1
            if self.variant == "talk_v1":  # the talk's first rules: an invalid move loses at once
                state["outcome"] = "loss"
                return game_over_message(f"Invalid move: {verdict.problem} You lose.", board)
            return turn_message(invalid_event(str(verdict.problem)), board)
        board = play(board, verdict.cell, "X")
        state["moves"].append(f"X{verdict.cell}")
        outcome: Outcome | None = result(board)
        event = ""
        if outcome is None:
            reply = opponent_move(board, state["example_seed"], state["random_move_prob"]).cell
            board = play(board, reply, "O")
            state["moves"].append(f"O{reply}")
            outcome = result(board)
            event = opponent_event(reply)
        state["board"] = board
        if outcome is None:
            return turn_message(event, board)
        state["outcome"] = outcome
        verdicts = {"win": "You win!", "draw": "It's a draw.", "loss": "You lose."}
        return game_over_message(f"{event} {verdicts[outcome]}".strip(), board)

    async def play_interactive(
        self,
        client: pa.ModelClient,
        *,
        console: Console,
        ask: Callable[[str], str],
        sampling: pa.Sampling | None = None,
        seed: int = 0,
        show_thinking: bool = False,
    ) -> Outcome:
        """A person plays O against the model in the terminal; returns the model's outcome."""
        from tictactoe.play import play_game

        return await play_game(
            self,
            client,
            console=console,
            ask=ask,
            sampling=sampling or self.sampling,
            seed=seed,
            show_thinking=show_thinking,
        )


def load_environment(
    num_examples: int = 1000,
    min_random_move_prob: float | None = None,
    max_random_move_prob: float | None = None,
    max_turns: int = 8,
    num_groups: int = 1,
    seed: int = 0,
    opponent: str | None = None,
    variant: str = "standard",
    rewards: str = "talk",
    invalid_move_penalty: float | None = None,
    unfinished_reward: float | None = None,
    format_weight: float | None = None,
) -> TicTacToeEnv:
    """The tic-tac-toe environment (see the README for every argument).

    ``min/max_random_move_prob`` default to 0.0/1.0 (``talk_v1``: 1.0/1.0, a random opponent);
    ``opponent="optimal"`` or ``"random"`` sets both to 0.0 or 1.0. ``rewards`` names the rules for
    invalid moves and unfinished games (``"talk"``: −0.1 once per game, unfinished 0; ``"strict"``:
    −0.1 per invalid reply, unfinished −0.5); ``invalid_move_penalty`` and ``unfinished_reward``
    change their numbers, ``format_weight`` the weight of the format reward (0.2).
    """
    check_int("num_examples", num_examples, minimum=1)
    check_int("max_turns", max_turns, minimum=1)
    check_int("num_groups", num_groups, minimum=1)
    check_int("seed", seed)
    if num_groups > num_examples:
        raise ValueError(f"num_groups ({num_groups}) cannot exceed num_examples ({num_examples})")
    check_choice("variant", variant, VARIANTS)
    check_choice("rewards", rewards, tuple(REWARD_RULES))
    rules_of_reward = _reward_rules(rewards, invalid_move_penalty, unfinished_reward, format_weight)
    rules: Variant = "talk_v1" if variant == "talk_v1" else "standard"
    low, high = _random_move_range(opponent, min_random_move_prob, max_random_move_prob, rules)
    parser = pa.XMLParser(["move"] if rules == "talk_v1" else ["think", "move"], answer_field="move")
    rows = make_dataset(
        num_examples,
        min_random_move_prob=low,
        max_random_move_prob=high,
        num_groups=num_groups,
        seed=seed,
        variant=rules,
    )
    return TicTacToeEnv(
        dataset=rows,
        system_prompt=system_prompt(rules),
        parser=parser,
        rubric=make_rubric(rules, parser, rules_of_reward),
        max_turns=max_turns,
        variant=rules,
    )


def _reward_rules(
    name: str, penalty: float | None, unfinished_value: float | None, format_weight: float | None
) -> RewardRules:
    rules = REWARD_RULES[name]
    if format_weight is not None:
        check_number("format_weight", format_weight, low=0.0, high=10.0)
        rules = replace(rules, format_weight=float(format_weight))
    if penalty is not None:
        check_number("invalid_move_penalty", penalty, low=0.0, high=10.0)
        rules = replace(rules, invalid_move_penalty=float(penalty))
    if unfinished_value is not None:
        check_number("unfinished_reward", unfinished_value, low=-10.0, high=1.0)
        rules = replace(rules, unfinished_reward=float(unfinished_value))
    return rules


def _random_move_range(
    opponent: str | None, low: float | None, high: float | None, variant: str
) -> tuple[float, float]:
    for name, value in (("min_random_move_prob", low), ("max_random_move_prob", high)):
        if value is not None:
            check_number(name, value, low=0.0, high=1.0)
    if opponent is not None:
        if not isinstance(opponent, str) or opponent not in OPPONENTS:
            raise ValueError(f"opponent must be 'optimal' or 'random' (or omitted), got {opponent!r}")
        fixed = OPPONENTS[opponent]
        for name, value in (("min_random_move_prob", low), ("max_random_move_prob", high)):
            if value is not None and value != fixed:
                raise ValueError(f"opponent={opponent!r} means {name}={fixed}, which conflicts with {value}")
        return fixed, fixed
    default = (1.0, 1.0) if variant == "talk_v1" else (0.0, 1.0)
    low = default[0] if low is None else float(low)
    high = default[1] if high is None else float(high)
    if low > high:
        raise ValueError(
            f"min_random_move_prob ({low}) exceeds max_random_move_prob ({high})"
            + (" (talk_v1 defaults both to 1.0)" if variant == "talk_v1" else "")
        )
    return low, high
