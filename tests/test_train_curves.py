"""``palaestra train curves``: series grouped by what they measure, and an RL run's held-out
evaluations listed with a link to each one's report."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import palaestra as pa
from palaestra.cli import main
from palaestra.eval.store import RunMetadata, RunStore
from palaestra.eval.summary import summarize


def write_metrics(run_dir: Path, records: list[dict[str, Any]]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def sft_run(path: Path) -> Path:
    return write_metrics(
        path,
        [
            {"step": s, "loss": 3.0 / s, "lr": 1e-4, "grad_norm": 2.0 / s, "trained_tokens_per_s": 900.0}
            for s in range(1, 6)
        ],
    )


def rl_run(path: Path) -> Path:
    records = [{"step": 0, "eval/reward": 0.2, "eval/held-out/reward": 0.2}]
    records += [
        {
            "step": s,
            "reward": 0.1 * s,
            "loss": -0.01 * s,
            "grad_norm": 0.5,
            "entropy": 1.0,
            "groups": 2,
            "metrics/won": 0.1 * s,
            "seconds_sampling": 1.0,
            "seconds_training": 0.5,
        }
        for s in (1, 2)
    ]
    records[-1].update({"eval/reward": 0.6, "eval/held-out/reward": 0.6})
    run_dir = write_metrics(path, records)
    for step, reward in ((0, 0.2), (2, 0.6)):
        rollouts = [
            pa.Rollout(
                i,
                0,
                0,
                [{"role": "user", "content": f"task {i}"}],
                [{"role": "assistant", "content": "x"}],
                reward=reward,
                metrics={"won": reward},
            )
            for i in range(2)
        ]
        folder = run_dir / "evals" / f"step-{step:06d}" / "held-out"
        folder.mkdir(parents=True)
        store = RunStore(folder)
        store.rewrite(rollouts)
        store.write_metadata(
            RunMetadata(
                env_id="toy-held-out",
                model="policy",
                spec=pa.RunSpec(),
                status="complete",
                summary=summarize(rollouts, rollouts_per_example=1),
            )
        )
    return run_dir


def figures(page: str) -> dict[tuple[str, str], str]:
    """(kind, key) → the runs a chart draws."""
    return {
        (k, key): runs
        for k, key, runs in re.findall(
            r'<figure data-kind="(\w+)" data-key="([^"]+)" data-runs="([^"]*)"', page
        )
    }


def test_sft_and_rl_losses_never_share_a_chart(tmp_path: Path, capsys: Any) -> None:
    sft, rl = sft_run(tmp_path / "sft"), rl_run(tmp_path / "rl")
    out = tmp_path / "both.html"
    assert main(["train", "curves", str(sft), str(rl), "-o", str(out)]) == 0
    page = out.read_text()
    charts = figures(page)
    assert charts[("sft", "loss")] == str(sft) and charts[("rl", "loss")] == str(rl)
    assert charts[("sft", "grad_norm")] == str(sft) and charts[("rl", "grad_norm")] == str(rl)
    assert ("sft", "reward") not in charts and ("rl", "trained_tokens_per_s") not in charts
    assert "cross-entropy of the assistant tokens" in page and "policy loss (the RL objective" in page
    headings = re.findall(r"<h3>([^<]+)</h3>", page)
    assert headings.index("SFT: what it learns") < headings.index("RL: reward")
    assert "RL: held-out evaluations" in headings and "RL: the environment&#x27;s metrics" in headings
    assert {k for k, _ in charts if k == "rl"} and ("rl", "metrics/won") in charts


def test_an_rl_runs_page_lists_its_held_out_evaluations_with_their_reports(tmp_path: Path) -> None:
    rl = rl_run(tmp_path / "rl")
    assert main(["train", "curves", str(rl)]) == 0
    page = (rl / "curves.html").read_text()
    table = page.split('<table class="held-out">', 1)[1].split("</table>", 1)[0]
    rows = re.findall(
        r"<td>(\d+)</td><td>held-out</td><td>2</td><td><a href=\"([^\"]+)\">([\d.]+)</a>", table
    )
    assert rows == [
        ("0", "evals/step-000000/held-out/report.html", "0.200"),
        ("2", "evals/step-000002/held-out/report.html", "0.600"),
    ]
    for _, href, _ in rows:
        assert "task 1" in (rl / href).read_text()  # the evaluation's own report, its rollouts in it
    assert figures(page)[("rl", "eval/held-out/reward")] == str(rl)
