"""``palaestra play ENV`` for environments without a mode of their own: the person is the model.

Through a pseudo-terminal (pexpect) as a person uses it, on the bundled multi-turn ``double_check``;
and directly, with a scripted ``ask``, on a tool environment and on the ways a game ends.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

import palaestra as pa
from palaestra.cli import main
from palaestra.play import play_as_model

PALAESTRA = Path(sys.executable).parent / "palaestra"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def solve(question: str) -> int:
    found = re.search(r"What is (\d+) ([-+*]) (\d+)\?", question)
    assert found, question
    a, op, b = found.groups()
    return int(a) + int(b) if op == "+" else int(a) - int(b) if op == "-" else int(a) * int(b)


def test_a_person_plays_double_check_in_a_terminal_and_sees_the_reward() -> None:
    pexpect = pytest.importorskip("pexpect", reason="the terminal test needs pexpect (a dev extra)")
    child = pexpect.spawn(
        str(PALAESTRA),
        ["play", "double_check", "--seed", "2"],
        encoding="utf-8",
        timeout=30,
        dimensions=(50, 120),
        env={"PATH": "/usr/bin:/bin", "TERM": "xterm", "NO_COLOR": "1"},
    )
    child.expect(r"you> ")
    screen = ANSI.sub("", child.before)
    assert "You are the model" in screen and "instructions: Answer the arithmetic question" in screen
    answer = solve(screen)
    child.sendline(f"<answer>{answer}</answer>")
    child.expect(r"you> ")
    assert "environment: Are you sure?" in ANSI.sub("", child.before)
    child.sendline(f"<answer>{answer}</answer>")
    child.expect(pexpect.EOF)
    end = ANSI.sub("", child.before)
    child.close()
    assert child.exitstatus == 0
    assert "Game over: answered_twice" in end and "reward 1.000" in end
    assert re.search(r"correct_answer = 1\.000 +\(weight 1\)", end)


def lookup(country: str) -> str:
    """The capital of a country.

    Args:
        country: the country's name
    """
    return {"France": "Paris"}.get(country, "unknown")


def tool_env() -> pa.ToolEnv:
    def right(completion: pa.Messages) -> float:
        return float("Paris" in str(completion[-1].get("content")))

    def calls(completion: pa.Messages) -> float:
        return float(sum(len(m.get("tool_calls") or []) for m in completion))

    rubric = pa.Rubric([right, calls], weights=[1.0, 0.0], higher_is_better=[True, False])
    return pa.ToolEnv(dataset=[{"question": "What is the capital of France?"}], tools=[lookup], rubric=rubric)


async def test_a_person_calls_a_tool_and_answers_from_its_result() -> None:
    typed = iter(['/call lookup {"country": "France"}', "It is \\", "Paris."])
    screen = io.StringIO()
    code = await play_as_model(tool_env(), console=Console(file=screen, width=120), ask=lambda _: next(typed))
    out = screen.getvalue()
    assert code == 0 and "tools you can call with /call NAME {json}: lookup" in out
    assert "tool result: Paris" in out and "reward 1.000" in out
    assert "calls = 1.000  (metric, lower is better)" in out


async def test_an_empty_line_or_ctrl_d_leaves_the_game() -> None:
    for reply in ("", EOFError()):

        def ask(_: str, reply: object = reply) -> str:
            if isinstance(reply, BaseException):
                raise reply
            return str(reply)

        screen = io.StringIO()
        code = await play_as_model(tool_env(), console=Console(file=screen), ask=ask)
        assert code == 1 and "You left the game." in screen.getvalue()


def test_a_model_is_refused_where_the_person_is_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["play", "double_check", "-m", "gpt-4.1-mini"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no two-player mode: you play the model" in err and len(err.splitlines()) == 1
    assert main(["play", "double_check", "--example", "10000"]) == 2
    assert "--example 10000" in capsys.readouterr().err
