"""``palaestra play ENV`` for any environment: you are the model.

The environment runs as in an evaluation, with one difference: the model is a person at the
terminal (``PersonClient``). Each turn shows what the environment said since your last reply
(its system prompt, the task, its answers, tool results) and reads yours; the episode ends as
the environment decides (its stop conditions, ``max_turns``, a ``Final``), and then the reward
is shown with each reward function's value, weight and direction. Environments with a mode of
their own (``play_interactive``: two-player games such as tic-tac-toe, you against a model)
keep it; the CLI chooses.

What you type is the assistant message as it is. End a line with ``\\`` to go on to the next
(a ``<think>`` block, say); ``/call NAME {"arg": 1}`` calls one of the environment's tools; an
empty line or Ctrl-D ends the game.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

from palaestra.clients.base import ModelError
from palaestra.engine import stream_groups
from palaestra.envs.base import Environment
from palaestra.types import Messages, ModelResponse, RunSpec, Sampling, content_text

WHO = {"system": "instructions", "user": "environment", "tool": "tool result"}
STYLE = {"system": "dim", "user": "bold", "tool": "yellow"}


class PersonLeft(ModelError):
    """The person ended the game (an empty line, Ctrl-D)."""


class PersonClient:
    """A ``ModelClient`` that is a person: it shows the new messages and reads the reply."""

    model = "you"

    def __init__(self, console: Console, ask: Callable[[str], str]) -> None:
        self.console, self.ask = console, ask
        self.shown = 0  # messages already on screen
        self.left = False

    async def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> ModelResponse:
        if self.shown == 0 and tools:
            names = ", ".join(str((t.get("function") or {}).get("name")) for t in tools)
            self.console.print(f"[dim]tools you can call with /call NAME {{json}}: {escape(names)}[/dim]")
        for message in messages[self.shown :]:
            self.show(message)
        text = await asyncio.to_thread(self.read)
        self.shown = len(messages) + 1  # your reply is on screen already
        return ModelResponse(message=self.message(text), finish_reason="stop")

    def show(self, message: dict[str, Any]) -> None:
        """One message of the conversation, labelled by who said it."""
        role = str(message.get("role"))
        if role == "assistant":
            return  # yours, typed a moment ago
        label, style = WHO.get(role, role), STYLE.get(role, "")
        body = content_text(message.get("content"))
        self.console.print(f"[{style or 'default'}]{escape(label)}:[/] {escape(body)}", soft_wrap=True)

    def read(self) -> str:
        """Your reply: lines ending in ``\\`` go on; an empty first line or Ctrl-D ends the game."""
        try:
            line = self.ask("you> ")
            while line.endswith("\\"):
                line = line[:-1] + "\n" + self.ask("...> ")
        except EOFError:
            line = ""
        if not line.strip():
            self.left = True
            raise PersonLeft("you left the game")
        return line

    @staticmethod
    def message(text: str) -> dict[str, Any]:
        """The assistant message for ``text``: ``/call NAME JSON`` is a tool call, anything else content."""
        if text.startswith("/call "):
            name, _, arguments = text[len("/call ") :].strip().partition(" ")
            call = {
                "id": "call_0",
                "type": "function",
                "function": {"name": name, "arguments": arguments or "{}"},
            }
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return {"role": "assistant", "content": text}


def _no_timeouts(env: Environment) -> None:
    """A person's turns are not a model's: no rollout timeout while one plays (an EnvGroup's too)."""
    env.timeout = None
    for inner in getattr(env, "envs", {}).values():
        _no_timeouts(inner)


async def play_as_model(
    env: Environment,
    *,
    console: Console,
    ask: Callable[[str], str],
    seed: int = 0,
    example: int | None = None,
) -> int:
    """Play one episode of ``env`` with the person as the model; returns the exit status (1: left)."""
    examples = env.select(-1)
    index = seed % len(examples) if example is None else example
    if not 0 <= index < len(examples):
        raise ValueError(f"--example {index}: the environment has examples 0 to {len(examples) - 1}")
    _no_timeouts(env)
    person = PersonClient(console, ask)
    console.print(f"[bold]You are the model[/bold] (example {index} of {len(examples)}). " + _HELP)
    spec = RunSpec(rollouts_per_example=1, max_concurrent=1, seed=seed, max_failures_in_a_row=0)
    rollouts = []
    async with contextlib.aclosing(stream_groups(env, person, [examples[index]], spec)) as groups:
        async for group in groups:
            rollouts.extend(group)
    if person.left:
        console.print("You left the game.")
        return 1
    (rollout,) = rollouts
    for message in rollout.completion[_shown_in_completion(rollout, person) :]:
        person.show(message)  # what the environment said after your last reply
    console.print(f"\n[bold]Game over[/bold]: {escape(rollout.stop_reason or 'done')}")
    if rollout.error is not None:
        console.print(f"error ({rollout.error.stage}): {escape(rollout.error.message)}")
    info = env.metric_info()
    reward = "none" if rollout.reward is None else f"{rollout.reward:.3f}"
    console.print(f"[bold]reward {reward}[/bold]")
    for name, value in rollout.metrics.items():
        weight = (info.get(name) or {}).get("weight")
        lower = (info.get(name) or {}).get("higher_is_better") is False
        note = "metric" if weight == 0 else f"weight {weight:g}" if weight is not None else ""
        note += ", lower is better" if lower else ""
        console.print(f"  {escape(name)} = {value:.3f}" + (f"  ({note})" if note else ""))
    return 0


def _shown_in_completion(rollout: Any, person: PersonClient) -> int:
    """How many of the completion's messages the person has already seen."""
    return max(0, person.shown - len(rollout.prompt))


_HELP = (
    "Type your reply; end a line with \\ to continue it; /call NAME {json} calls a tool; an empty line quits."
)
