"""An environment hook, a stop condition or a reward function that raises anything (SystemExit,
KeyboardInterrupt, a BaseException of its own) fails its rollout, recorded; the run goes on and
saves every rollout. Run in a subprocess: before, such an exception ended the whole process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import palaestra as pa

SCRIPT = """
import asyncio, sys
import palaestra as pa


class Odd(BaseException):
    pass


RAISES = {"exit": SystemExit(3), "interrupt": KeyboardInterrupt(), "odd": Odd("odd")}


class Hooks(pa.MultiTurnEnv):
    async def setup_state(self, state):
        if state.example.row["where"] == "setup":
            raise RAISES[state.example.row["what"]]

    async def env_response(self, messages, state):
        if state.example.row["where"] == "env_response":
            raise RAISES[state.example.row["what"]]
        return [{"role": "user", "content": "again"}]

    @pa.stop
    def twice(self, state):
        if state.example.row["where"] == "stop":
            raise RAISES[state.example.row["what"]]
        return state.turn >= 2


def reward(state, info):
    if state.example.row["where"] == "reward":
        raise RAISES[state.example.row["what"]]
    return 1.0


async def main(out):
    rows = [{"question": f"{w} {x}", "where": w, "what": x}
            for w in ("setup", "env_response", "stop", "reward", "none") for x in RAISES]
    env = Hooks(dataset=rows, rubric=pa.Rubric([reward]))
    client = pa.ScriptedClient(lambda messages, rng: "ok")
    await pa.evaluate(env, client, pa.RunSpec(rollouts_per_example=2), output_dir=out, env_id="hooks")

    import palaestra.compat.verifiers as vf  # a verifiers 0.1 ToolEnv: its tools too

    def leave() -> str:
        "Ends the process, if let."
        raise SystemExit(3)

    tool_env = vf.ToolEnv(dataset=[{"question": "q", "answer": "a"}], tools=[leave], max_turns=3)
    call = {"id": "c1", "type": "function", "function": {"name": "leave", "arguments": "{}"}}
    caller = pa.ScriptedClient(
        lambda messages: {"role": "assistant", "content": "", "tool_calls": [call]} if len(messages) == 1 else "done"
    )
    await pa.evaluate(tool_env, caller, pa.RunSpec(), output_dir=out, env_id="vf-tools")
    print("finished")


asyncio.run(main(sys.argv[1]))
"""


def test_a_run_survives_user_code_that_raises_anything_and_records_it(tmp_path: Path) -> None:
    script = tmp_path / "hooks.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "finished", done.stderr[-3000:]
    [path] = sorted((tmp_path / "out" / "evals").glob("hooks--*/*"))
    run = pa.load_run(path)
    assert run.metadata.status == "complete" and len(run.rollouts) == 30
    for rollout in run.rollouts:
        where, what = rollout.prompt[-1]["content"].split()
        if where == "none":
            assert rollout.error is None and rollout.reward == 1.0
            continue
        assert rollout.error is not None, (where, what)
        assert (
            rollout.error.type == {"exit": "SystemExit", "interrupt": "KeyboardInterrupt", "odd": "Odd"}[what]
        )
        assert rollout.error.stage == ("scoring" if where == "reward" else "env")
        assert rollout.reward is None


async def test_cancelling_a_run_still_cancels_its_rollouts() -> None:
    """Only user code's exceptions are caught: the run's own cancellation goes through."""
    started = asyncio.Event()

    class Slow(pa.MultiTurnEnv):
        async def env_response(self, messages: pa.Messages, state: pa.State) -> pa.Messages:
            started.set()
            await asyncio.sleep(30)
            return []

    env = Slow(dataset=[{"question": "q"}])
    run = asyncio.create_task(env.run(pa.ScriptedClient(lambda messages, rng: "ok")))
    await asyncio.wait_for(started.wait(), 5)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


def test_a_verifiers_tool_that_raises_system_exit_is_the_tools_error(tmp_path: Path) -> None:
    script = tmp_path / "hooks.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "finished", done.stderr[-3000:]
    [path] = sorted((tmp_path / "out" / "evals").glob("vf-tools--*/*"))
    [rollout] = pa.load_run(path).rollouts
    assert rollout.error is None
    assert [m["content"] for m in rollout.completion if m["role"] == "tool"] == [
        "SystemExit: 3"
    ]  # verifiers formats an error as str(exc)
