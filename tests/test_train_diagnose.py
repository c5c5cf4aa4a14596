"""What an RL batch offers to learn from (signal.py), and the findings of ``palaestra train diagnose``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import palaestra as pa
from palaestra.cli import main
from palaestra.train.diagnose import diagnose, report
from palaestra.train.signal import advantage_balance, flat_groups, unparsed


def rollout(example: int, reward: float, *, tokens: int = 4, reply: str = "<move>4</move>") -> pa.Rollout:
    turn = pa.Turn(0, 1, token_ids=list(range(tokens)), logprobs=[0.0] * tokens)
    return pa.Rollout(
        example, 0, 0, [], completion=[{"role": "assistant", "content": reply}], turns=[turn], reward=reward
    )


def test_flat_groups_share_and_their_reward() -> None:
    batch = [
        rollout(0, 0.0),
        rollout(0, 0.0),
        rollout(1, 1.0),
        rollout(1, 0.0),
        rollout(2, 0.0),
        rollout(2, 0.0),
    ]
    assert flat_groups(batch) == (pytest.approx(2 / 3), 0.0)
    assert flat_groups([rollout(0, 1.0), rollout(0, 0.5)]) == (0.0, None)
    assert flat_groups([]) == (None, None)


def test_unparsed_counts_final_replies_without_an_answer_but_not_tool_calls() -> None:
    parser = pa.XMLParser(["move"])
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}
    batch = [rollout(0, 0.0), rollout(0, 0.0, reply="I think cell 4")]
    batch[0].completion.insert(0, call)  # a tool call is not a final reply
    assert unparsed(batch, parser) == 0.5
    assert unparsed(batch, None) is None


def test_advantage_balance_is_negative_when_the_worse_rollouts_are_longer() -> None:
    short_win, long_loss = rollout(0, 1.0, tokens=10), rollout(0, 0.0, tokens=90)
    assert advantage_balance([short_win, long_loss], [0.5, -0.5]) == pytest.approx((5 - 45) / (5 + 45))
    assert advantage_balance([short_win, rollout(0, 0.0, tokens=10)], [0.5, -0.5]) == 0.0
    assert advantage_balance([short_win], [0.0]) is None


def record(step: int, **values: float) -> dict[str, float]:
    base = {"step": step, "reward": 0.5, "seconds_sampling": 1.0, "entropy": 1.0, "truncated": 0.0}
    return {**base, **values}


def levels(findings: list) -> list[tuple[str, str]]:
    return [(f.level, f.text) for f in findings]


def test_a_run_without_signal_is_told_so_with_what_to_change() -> None:
    records = [record(s, flat_groups=0.84, flat_reward=0.0, reward=0.05) for s in range(1, 21)]
    text = " ".join(f.text for f in diagnose(records, {"sampling": {"temperature": 0.7}}))
    assert "84% of groups have one reward (their rollouts all scored 0.00): no signal" in text
    assert "fail every attempt" in text


def test_truncation_unparsed_balance_entropy_and_held_out_each_have_a_finding() -> None:
    records = [record(0, **{"eval/reward": 0.30})]
    records[0].pop("seconds_sampling")  # step 0: the evaluation before the first step
    for s in range(1, 21):
        late = s > 15
        records.append(
            record(
                s,
                reward=0.2 + 0.02 * s,
                truncated=0.3 if late else 0.0,
                unparsed=0.5 if late else 0.0,
                advantage_balance=-0.6,
                entropy=3.0 if late else 1.0,
            )
        )
    records[-1]["eval/reward"] = 0.10
    found = " | ".join(
        f"{level}: {text}" for level, text in levels(diagnose(records, {"sampling": {"max_tokens": 64}}))
    )
    assert "30% of replies hit max_tokens (64)" in found
    assert "50% of final replies hold no answer" in found
    assert "advantage balance -0.60" in found
    assert "problem: entropy rose from 1.000 to 3.000" in found
    assert (
        "training reward rose (0.260 → 0.560) while held-out fell (0.300 at step 0 → 0.100 at step 20)"
        in found
    )


def test_a_healthy_run_says_its_held_out_reward_rose() -> None:
    records = [record(s, reward=0.3 + 0.01 * s, flat_groups=0.1) for s in range(1, 21)]
    records[0]["eval/reward"], records[-1]["eval/reward"] = 0.3, 0.6
    assert levels(diagnose(records)) == [
        ("ok", "held-out reward rose from 0.300 to 0.600"),
        ("ok", "nothing the rules know looks wrong"),
    ]


def test_the_command_prints_the_figures_and_findings_and_refuses_what_is_no_rl_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "rl"
    run.mkdir()
    lines = [
        record(s, flat_groups=0.9, flat_reward=0.0, reward=0.02, **{"metrics/won": 0.1}) for s in range(1, 9)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run / "config.toml").write_text("[train]\nrollouts_per_example = 8\n[sampling]\ntemperature = 0.7\n")
    assert main(["train", "diagnose", str(run)]) == 0
    out = capsys.readouterr().out
    assert "groups with one reward (no signal)       90% → 90%" in out
    assert "metrics/won" in out and "problem: 90% of groups have one reward" in out
    assert out.strip() == report(run)

    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    assert main(["train", "diagnose", str(sft)]) == 2
    assert "is not an RL run (its metrics have no reward)" in capsys.readouterr().err
    assert main(["train", "diagnose", str(tmp_path / "nowhere")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
