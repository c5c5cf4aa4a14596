"""long_context_qa: documents far longer than the prompt, solved by a scripted RLM policy through
the REPL and its sub-calls, and not by a policy that reads the prompt."""

from __future__ import annotations

import json

import long_context_qa as lc
import pytest

import palaestra as pa
from palaestra.cli import main
from palaestra.repl import live_workers
from palaestra.testing.repl import sandbox_problem, sandbox_processes

PROBLEM = sandbox_problem()
needs_bwrap = pytest.mark.skipif(PROBLEM is not None, reason=f"no bubblewrap sandbox here: {PROBLEM}")


def test_documents_are_long_generated_from_the_seed_and_not_in_the_prompt() -> None:
    env = lc.load_environment(num_examples=3)
    rows = lc.make_dataset(3, seed=0, records=1500)
    assert rows == lc.make_dataset(3, seed=0, records=1500) != lc.make_dataset(3, seed=1, records=1500)
    assert [r["info"]["kind"] for r in rows] == ["needle", "count", "sum"]
    for row, example in zip(rows, env.examples, strict=True):
        assert len(row["context"]) > 100_000  # ~40,000 tokens: beyond a tiny model's or SmolLM2's context
        prompt = json.dumps(example.prompt)
        assert "Record 0" not in prompt and len(prompt) < 1000
        assert f"`context` is a str of {len(row['context']):,} characters." in prompt
    needle = rows[0]
    name = lc.NEEDLE.search(needle["question"]).group(1)  # type: ignore[union-attr]  # the needle question
    assert (
        needle["context"].count(f": {name}, ") == 1 and f"lives in {needle['answer']}," in needle["context"]
    )


@needs_bwrap
async def test_the_rlm_solver_answers_every_kind_through_the_repl() -> None:
    env = lc.load_environment(num_examples=6)
    rollouts = await env.run(pa.ScriptedClient(lc.rlm_solver), pa.RunSpec(max_concurrent=6))
    assert [r.reward for r in rollouts] == [1.0] * 6
    assert all(r.stop_reason == "final_answer" and r.error is None for r in rollouts)
    needles = [r for r in rollouts if r.info["kind"] == "needle"]
    assert all(r.metrics["sub_calls"] == 5 for r in needles)  # 1,500 records, 300 a sub-call
    assert all(r.metrics["sub_calls"] == 0 for r in rollouts if r.info["kind"] != "needle")
    assert all(r.usage.prompt_tokens > 15_000 for r in needles)  # the sub-calls read the document
    assert live_workers() == 0 and not sandbox_processes()


@needs_bwrap
async def test_reading_the_prompt_alone_does_not_solve_them() -> None:
    env = lc.load_environment(num_examples=9)
    rollouts = await env.run(pa.ScriptedClient(lc.prompt_reader), pa.RunSpec(rollouts_per_example=2))
    assert sum(r.reward or 0 for r in rollouts) / len(rollouts) < 0.2
    assert all(r.metrics["answered"] == 1.0 for r in rollouts)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ('{"records": 5}', "records must be an integer ≥ 10"),
        ('{"limits": {"disk": 1}}', "limits: unknown disk"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    args: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["eval", "long_context_qa", "-m", "scripted:long_context_qa:rlm_solver", "-a", args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
