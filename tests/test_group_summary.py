"""An EnvGroup's summary: pass@k by each environment's own threshold, metric means over the rows
that have the metric (not the zeros filled in for the others), a per-environment table readable
in a log."""

from __future__ import annotations

import io

from rich.console import Console

import palaestra as pa
from palaestra.eval.summary_view import render_summary


def half(completion: pa.Messages) -> float:
    return 0.5


def env(name: str, threshold: float) -> pa.SingleTurnEnv:
    def own(completion: pa.Messages) -> float:
        return 1.0

    own.__name__ = f"{name}_metric"
    rubric = pa.Rubric([half, own], weights=[1.0, 0.0])
    rows = [{"question": f"{name} {i}"} for i in range(3)]
    return pa.SingleTurnEnv(dataset=rows, rubric=rubric, pass_threshold=threshold)


async def group_run() -> pa.EvalRun:
    group = pa.EnvGroup({"strict": env("strict", 0.9), "lenient": env("lenient", 0.1)})
    client = pa.ScriptedClient(lambda messages: "ok")
    return await pa.evaluate(
        group, client, pa.RunSpec(rollouts_per_example=2), output_dir=None, env_id="group"
    )


async def test_pass_at_k_uses_each_environments_threshold() -> None:
    summary = (await group_run()).summary
    by_env = summary["by_env"]
    assert by_env["strict"]["pass_at_k"]["1"] == 0.0 and by_env["strict"]["pass_threshold"] == 0.9
    assert by_env["lenient"]["pass_at_k"]["1"] == 1.0 and by_env["lenient"]["pass_threshold"] == 0.1
    assert summary["pass_at_k"]["1"] == 0.5  # every reward is 0.5: it passes the lenient bar only


async def test_a_metric_mean_is_over_the_rows_that_have_it() -> None:
    metrics = (await group_run()).summary["metrics"]
    assert metrics["strict_metric"]["mean"] == 1.0 and metrics["strict_metric"]["n"] == 6  # no filled zeros
    assert metrics["lenient_metric"]["mean"] == 1.0 and metrics["half"]["n"] == 12


async def test_the_per_environment_table_is_plain_lines_in_a_log() -> None:
    out = io.StringIO()
    render_summary(Console(file=out, width=80), (await group_run()).summary)  # not a terminal
    text = out.getvalue()
    lines = [
        line for line in text.splitlines() if line.startswith("  strict: ") or line.startswith("  lenient: ")
    ]
    assert len(lines) == 2, text
    strict = next(line for line in lines if "strict:" in line)
    assert "6 rollouts · reward 0.500" in strict and "pass@1 0.000 (reward ≥ 0.9)" in strict
    assert "strict_metric 1.000" in strict and "lenient_metric" not in strict
