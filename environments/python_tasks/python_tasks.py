"""python_tasks: write a Python function that passes hidden tests, with a sandboxed REPL to try it in.

Each example asks for one function (``python_tasks_data.TASKS``: FizzBuzz, palindromes, gcd,
flatten, ...). The model may run code with the ``python`` tool (``pa.ReplEnv``: its own
sandboxed worker per rollout) and answers with the whole function in a fenced ```python block,
in a reply without tool calls. That code then runs in a fresh worker of the same sandbox, which
calls the function on the hidden test inputs and sends back the outputs as JSON; the comparison
with the expected outputs happens here, outside the sandbox, which never sees them. The reward
is the fraction of tests passed. ``solver`` and ``flawed`` are scripted policies:
``palaestra eval python_tasks -m scripted:python_tasks:solver``.
"""

from __future__ import annotations

import ast
import json
import random
import re
from typing import Any

from python_tasks_data import TASKS, Task

import palaestra as pa
from palaestra.checks import check_int, check_number
from palaestra.repl import ReplSession
from palaestra.testing.repl import python_call

SYSTEM_PROMPT = (
    "You write Python functions. You may run code with the python tool (a persistent Python "
    "interpreter) to try your function. When it is done, reply without a tool call and give the "
    "complete function in a ```python code block; it is then run on hidden tests."
)
CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
HARNESS = """
import json as _json
_outputs = []
for _args in _json.loads({args!r}):
    try:
        _outputs.append({{"ok": _json.dumps({name}(*_args))}})
    except BaseException as _exc:
        _outputs.append({{"error": type(_exc).__name__}})
_json.dumps(_outputs)
"""


def make_dataset(num_examples: int, seed: int) -> list[dict[str, Any]]:
    """The first ``num_examples`` tasks in an order drawn from ``seed``."""
    if num_examples > len(TASKS):
        raise ValueError(f"num_examples: there are {len(TASKS)} tasks, not {num_examples}")
    order = list(TASKS)
    random.Random(seed).shuffle(order)
    return [
        {
            "question": f"Write a Python function `{t.signature}` that returns {t.description}.",
            "answer": t.expected(),
            "info": {"task": t.name, "tests": [list(args) for args in t.tests]},
        }
        for t in order[:num_examples]
    ]


def solution_code(text: str) -> str | None:
    """The last fenced code block of a reply, or None."""
    blocks = CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


class PythonTasksEnv(pa.ReplEnv):
    """The environment: ``check_seconds`` bounds the run of the hidden tests."""

    def __init__(self, *, check_seconds: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check_limits = pa.ReplLimits(
            call_seconds=check_seconds,
            call_cpu_seconds=max(1, int(check_seconds)),
            memory_mb=self.limits.memory_mb,
            max_processes=self.limits.max_processes,
            output_chars=self.limits.output_chars,
        )

    @pa.stop(priority=10)
    async def answered(self, messages: pa.Messages, state: pa.State) -> bool:
        """A reply without tool calls is the answer: run its code on the hidden tests now."""
        last = messages[-1] if messages else {}
        if last.get("role") != "assistant" or last.get("tool_calls"):
            return False
        code = solution_code(pa.content_text(last.get("content")))
        if code is None:
            state["check_error"] = "no ```python code block in the final reply"
            return True
        info = state.example.info
        state["outputs"] = await self.check(code, info["task"], info["tests"], state)
        return True

    async def check(self, code: str, name: str, tests: list[list[Any]], state: pa.State) -> list[Any]:
        """The function's output on each test: ``{"ok": value}``, or ``{"error": why}`` for a test
        it did not pass through (an exception, or code that did not run)."""
        checker = ReplSession(self.sandbox, self.check_limits)  # fresh: nothing the model did before
        try:
            reply, text = await checker.execute(code)
            if reply is None or reply.get("error"):
                state["check_error"] = text.splitlines()[-1] if text else "the code did not run"
                return [{"error": "not run"}] * len(tests)
            reply, text = await checker.execute(HARNESS.format(args=json.dumps(tests), name=name))
        finally:
            await checker.aclose()
        try:
            results = json.loads(ast.literal_eval(reply["value"])) if reply and reply.get("value") else None
            outputs = [
                {"ok": json.loads(r["ok"])} if "ok" in r else {"error": str(r["error"])} for r in results
            ]
        except (ValueError, TypeError, KeyError, SyntaxError):
            state["check_error"] = text.splitlines()[-1] if text else "the tests did not run"
            return [{"error": "not run"}] * len(tests)
        return outputs if len(outputs) == len(tests) else [None] * len(tests)


def tests_passed(state: pa.State, answer: list[Any]) -> float:
    """The fraction of hidden tests whose output equals the expected one."""
    outputs = state.get("outputs") or []
    return sum("ok" in o and o["ok"] == a for o, a in zip(outputs, answer, strict=False)) / len(answer)


def ran(state: pa.State) -> float:
    """1.0 when the final code ran and the tests could call it."""
    return float("outputs" in state and "check_error" not in state)


def load_environment(
    num_examples: int = len(TASKS),
    seed: int = 0,
    max_turns: int = 6,
    sandbox: str = "bubblewrap",
    limits: dict[str, Any] | None = None,
    check_seconds: float = 5.0,
) -> PythonTasksEnv:
    """The tasks, ordered by ``seed``; ``limits`` are ``pa.ReplLimits`` fields for the model's REPL."""
    check_int("num_examples", num_examples, minimum=1)
    check_int("seed", seed)
    check_int("max_turns", max_turns, minimum=1)
    check_number("check_seconds", check_seconds, low=0.1)
    rubric = pa.Rubric()
    rubric.add(tests_passed, weight=1.0)
    rubric.add(ran, weight=0.0)
    return PythonTasksEnv(
        dataset=make_dataset(num_examples, seed),
        system_prompt=SYSTEM_PROMPT,
        rubric=rubric,
        max_turns=max_turns,
        sandbox=sandbox,
        limits=pa.ReplLimits.from_dict(limits or {}),
        check_seconds=check_seconds,
    )


# Scripted policies: ``ScriptedClient(policy)`` plays them as the model.


def _task(messages: pa.Messages) -> Task:
    question = next(str(m.get("content") or "") for m in messages if m.get("role") == "user")
    return next(t for t in TASKS if f"`{t.signature}`" in question)


def _turn(messages: pa.Messages) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")


def solver(messages: pa.Messages) -> dict[str, Any] | str:
    """Tries the reference solution on an example in the REPL, then answers with it."""
    task = _task(messages)
    if _turn(messages) == 0:
        code = f"{task.reference}\nprint({task.name}(*{task.example!r}))"
        return {"content": "Let me try it.", "tool_calls": [python_call(code)]}
    return f"Here it is:\n```python\n{task.reference}```"


FLAWS = ("syntax_error", "infinite_loop", "huge_output")


def flawed(messages: pa.Messages) -> dict[str, Any] | str:
    """Fails the way models fail, one way per task (in turn): a syntax error, an infinite loop,
    or output without end (in the REPL and in the answer)."""
    task = _task(messages)
    flaw = FLAWS[TASKS.index(task) % len(FLAWS)]
    header = f"def {task.name}(*args):\n"
    if flaw == "syntax_error":
        return f"```python\n{header}    return (args[0] +\n```"
    if _turn(messages) == 0:
        body = "while True:\n    pass" if flaw == "infinite_loop" else "while True:\n    print('x' * 10_000)"
        return {"content": "", "tool_calls": [python_call(body)]}
    if flaw == "infinite_loop":
        return f"```python\n{header}    while True:\n        pass\n```"
    return f"```python\n{header}    print('x' * 10**6)\n    return 'x'\n```"
