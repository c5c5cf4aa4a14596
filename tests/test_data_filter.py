"""Teacher data: conditions parsed (never evaluated as code), rollouts kept or dropped with a reason,
text not to imitate counted, and `palaestra data filter` end to end over a saved run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest

import palaestra as pa
from palaestra.cli import main
from palaestra.data import messages_from_row
from palaestra.data.filter import Condition, ConditionError, filter_rollouts
from palaestra.types import ErrorInfo, Turn


def rollout(i: int, reward: float | None, *, replies: list[str] | None = None, **metrics: Any) -> pa.Rollout:
    replies = replies if replies is not None else ["<think>ok</think><move>4</move>"]
    completion = []
    for text in replies:
        completion += [{"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    turns = [Turn(index=t, prompt_messages=1 + 2 * t, finish_reason="stop") for t in range(len(replies))]
    return pa.Rollout(
        i,
        0,
        i,
        [{"role": "user", "content": "play"}],
        completion,
        reward=reward,
        metrics=dict(metrics),
        turns=turns,
        stop_reason="game_over",
    )


@pytest.mark.parametrize(
    ("text", "won", "drew", "reward", "holds"),
    [
        ("won == 1 or drew == 1", 1.0, 0.0, 1.0, True),
        ("won == 1 or drew == 1", 0.0, 0.0, 0.0, False),
        ("reward >= 0.5 and not drew == 1", 1.0, 0.0, 1.0, True),
        ("0.2 < reward <= 1", 0.0, 1.0, 0.7, True),
        ("reward > -0.05", 0.0, 0.0, -0.1, False),
        ('stop_reason == "game_over"', 0.0, 0.0, 0.0, True),
        ("turns == 2 and (won == 1 or drew == 1)", 0.0, 1.0, 0.5, True),
    ],
)
def test_conditions_read_metrics_reward_turns_and_stop_reason(
    text: str, won: float, drew: float, reward: float, holds: bool
) -> None:
    r = rollout(0, reward, replies=["a", "b"], won=won, drew=drew)
    assert Condition.parse(text).holds(r) is holds


@pytest.mark.parametrize(
    "text",
    [
        '__import__("os").system("echo pwned")',
        "reward.__class__ == 1",
        "[1][0] == 1",
        "(lambda: 1)() == 1",
        "won == 1 if reward else 0",
        "won = 1",
        "",
    ],
)
def test_anything_but_comparisons_is_refused_without_running_it(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConditionError):
        Condition.parse(text)
    assert "pwned" not in capsys.readouterr().out


def test_errors_truncated_replies_and_failed_conditions_are_dropped_with_their_reason() -> None:
    failed = rollout(1, None, won=1.0)
    failed.error = ErrorInfo("ModelTimeout", "slow", "model")
    cut = rollout(2, 1.0, won=1.0)
    cut.turns[-1].finish_reason = "length"
    lost = rollout(3, 0.0, won=0.0, drew=0.0)
    kept = rollout(4, 1.0, won=1.0, drew=0.0)
    rollouts = [failed, cut, lost, kept]
    report = filter_rollouts(rollouts, [Condition.parse("won == 1 or drew == 1")])
    assert [r.example_id for r in report.kept] == [4] and report.total == 4
    assert report.dropped == {
        "error (model)": 1,
        "final reply cut at max_tokens": 1,
        "not won == 1 or drew == 1": 1,
    }
    loose = filter_rollouts(rollouts, [Condition.parse("won == 1")], keep_errors=True, keep_truncated=True)
    assert [r.example_id for r in loose.kept] == [1, 2, 4]


def test_unknown_names_are_an_error_naming_what_exists() -> None:
    with pytest.raises(ConditionError, match=r"names wom, which the rollouts do not have; they have: .*won"):
        filter_rollouts([rollout(0, 1.0, won=1.0)], [Condition.parse("wom == 1")])


def test_text_not_to_imitate_is_counted_and_can_be_dropped() -> None:
    refusal = "<think>I cannot share my internal chain of thought.</think><move>4</move>"
    clean = rollout(0, 1.0, won=1.0)
    flagged = rollout(1, 1.0, won=1.0, replies=[refusal, "<think> </think><move>2</move>", "<move>3</move>"])
    flagged.turns[0].finish_reason = "length"  # a reply cut at max_tokens, not the last one
    report = filter_rollouts([clean, flagged])
    assert len(report.kept) == 2
    assert report.warnings == {
        "refusal inside <think>": 1,
        "empty <think> block": 1,
        "no <think> block": 1,
        "reply cut at max_tokens": 1,
    }
    strict = filter_rollouts([clean, flagged], drop_flagged=True)
    assert [r.example_id for r in strict.kept] == [0] and sum(strict.dropped.values()) == 1
    # with no <think> anywhere (an environment that asks for none), a missing block is no warning
    assert filter_rollouts([rollout(0, 1.0, replies=["<move>1</move>"])]).warnings == {}


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 games of the heuristic teacher against the default mixed opponent, saved."""
    out = tmp_path_factory.mktemp("runs")
    args = [
        "eval",
        "tictactoe",
        "-m",
        "scripted:tictactoe:heuristic_player",
        "-a",
        '{"num_examples": 200, "seed": 1}',
    ]
    assert main([*args, "-n", "200", "-r", "1", "-o", str(out), "--quiet"]) == 0
    return next((out / "evals").glob("*/*"))


def test_data_filter_writes_the_kept_games_as_a_chat_dataset(
    teacher_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, jsonl = tmp_path / "sft", tmp_path / "sft.jsonl"
    where = ["-w", "won == 1 or drew == 1", "-w", "format_reward == 1"]
    assert main(["data", "filter", str(teacher_run), "-o", str(out), *where, "--jsonl", str(jsonl)]) == 0
    run = pa.load_run(teacher_run)
    wanted = [r for r in run.rollouts if r.metrics["won"] == 1 or r.metrics["drew"] == 1]
    printed = capsys.readouterr().out
    assert f"kept {len(wanted)} of 200 rollouts" in printed
    assert f"dropped {200 - len(wanted)}: not won == 1 or drew == 1" in printed
    dataset = datasets.load_from_disk(str(out))
    assert len(dataset) == len(wanted) > 100
    for row, r in zip(dataset, wanted, strict=True):
        assert messages_from_row(row["prompt"]) == r.prompt
        assert messages_from_row(row["completion"]) == r.completion
        assert (row["reward"], row["won"] + row["drew"]) == (r.reward, 1.0)
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [line["completion"] for line in lines] == [r.completion for r in wanted]
    provenance = json.loads((out / "palaestra_filter.json").read_text())
    assert provenance["kept"] == len(wanted) and provenance["where"] == [
        "won == 1 or drew == 1",
        "format_reward == 1",
    ]


def test_data_filter_refuses_to_overwrite_and_writes_nothing_when_nothing_passes(
    teacher_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "there"
    existing.mkdir()
    assert main(["data", "filter", str(teacher_run), "-o", str(existing)]) == 2
    assert "exists" in capsys.readouterr().err and list(existing.iterdir()) == []
    nothing = tmp_path / "none"
    assert main(["data", "filter", str(teacher_run), "-o", str(nothing), "-w", "reward > 5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no rollout passed" in err and not nothing.exists()
    assert main(["data", "filter", str(teacher_run), "-o", str(nothing), "-w", "open('x')"]) == 2
    assert "not allowed" in capsys.readouterr().err


def test_mask_rejected_keeps_the_rejected_replies_as_context_with_weight_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from palaestra.train.data import load_chats

    runs = tmp_path / "runs"
    args = ["eval", "tictactoe", "-m", "scripted:tictactoe:recovering_teacher_player"]
    args += ["-a", '{"num_examples": 60, "seed": 1}', "-n", "60", "-r", "1", "-o", str(runs), "--quiet"]
    assert main(args) == 0
    run = next((runs / "evals").glob("*/*"))
    out, jsonl = tmp_path / "sft", tmp_path / "sft.jsonl"
    mask = ["--mask-rejected", "^Invalid move"]
    assert main(["data", "filter", str(run), "-o", str(out), *mask, "--jsonl", str(jsonl)]) == 0
    rollouts = pa.load_run(run).rollouts
    expected = [  # weight 0 on exactly the replies the environment answered "Invalid move: ..."
        [
            {**m, "weight": 0}
            if m["role"] == "assistant" and after["content"].startswith("Invalid move:")
            else m
            for m, after in zip(r.messages, [*r.messages[1:], {"content": ""}], strict=True)
        ]
        for r in rollouts
    ]
    masked = sum(m.get("weight") == 0 for c in expected for m in c)
    assert masked == sum(r.metrics["invalid_moves"] for r in rollouts) > 5
    assert f"{masked} replies answered with /^Invalid move/ kept with weight 0" in capsys.readouterr().out
    for data in (
        out,
        jsonl,
    ):  # the dataset folder and the JSON lines: the same conversations, the same weights
        assert [c.messages for c in load_chats(data)] == expected
    assert json.loads((out / "palaestra_filter.json").read_text())["mask_rejected"] == "^Invalid move"
    bad = tmp_path / "bad"
    assert main(["data", "filter", str(run), "-o", str(bad), "--mask-rejected", "(unclosed"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a regular expression" in err and not bad.exists()


def test_sft_data_refuses_a_weight_other_than_0_or_1_and_on_a_non_assistant_message(tmp_path: Path) -> None:
    from palaestra.train.data import DataError, load_chats

    for message, problem in (
        ({"role": "assistant", "content": "b", "weight": 0.5}, "weight must be 0 or 1, got 0.5"),
        ({"role": "assistant", "content": "b", "weight": "0"}, "weight must be 0 or 1, got '0'"),
        ({"role": "user", "content": "b", "weight": 0}, "only an assistant message can have weight 0"),
    ):
        data = tmp_path / "chats.jsonl"
        rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}]
        rows.append(
            {"messages": [{"role": "user", "content": "a"}, message, {"role": "assistant", "content": "c"}]}
        )
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(DataError, match=f"row 1: .*{problem}"):
            load_chats(data)


HOSTILE = {
    "parentheses": "(" * 5000 + "reward" + ")" * 5000,
    "nots": "not " * 5000 + "reward",
    "minus signs": "-" * 5000 + "reward > 0",
    "a chain of and": " and ".join(["reward > 0"] * 20000),
    "a chain of comparisons": " < ".join(["reward"] * 20000),
    "nots under the length limit": "not " * 490 + "reward",
    "minus signs under the length limit": "-" * 1900 + "reward > 0",
    "parentheses under the length limit": "(" * 900 + "reward" + ")" * 900,
    "nested and/or under the length limit": "(reward > 0 and " * 100 + "reward" + ")" * 100,
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_condition_nested_or_chained_thousands_deep_is_refused_at_once(
    text: str, teacher_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import resource
    import time

    memory_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()
    with pytest.raises(ConditionError) as caught:
        Condition.parse(text)
    assert time.process_time() - start < 0.5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - memory_before < 50_000  # kB
    message = str(caught.value)
    assert len(message) < 300 and "\n" not in message  # the condition is cut in the message
    assert any(why in message for why in ("longer than 2,000 characters", "deep", "too many nested"))

    out = tmp_path / "sft"
    assert main(["data", "filter", str(teacher_run), "-o", str(out), "-w", text]) == 2
    err = capsys.readouterr().err
    assert err.startswith("palaestra: error: condition") or err.startswith("palaestra: error: cannot parse")
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists()


def test_conditions_within_the_limits_still_hold() -> None:
    deep = Condition.parse("not " * 30 + "reward > 0")  # 30 nots, the comparison, its operands: 32 levels
    assert deep.holds(rollout(0, 1.0)) is True
    long_and = Condition.parse(" and ".join(["reward > 0"] * 130))  # 1,945 characters
    assert long_and.holds(rollout(0, 1.0)) is True and long_and.holds(rollout(0, 0.0)) is False


@pytest.mark.parametrize(
    ("jsonl", "message"),
    [
        ("no/such/folder/rows.jsonl", "no folder"),
        ("sft", "the same path"),
        ("a_file/rows.jsonl", "is a file"),
    ],
)
def test_an_unwritable_jsonl_is_refused_before_any_run_is_read(
    teacher_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], jsonl: str, message: str
) -> None:
    (tmp_path / "a_file").write_text("keep")
    out = tmp_path / "sft"
    assert main(["data", "filter", str(teacher_run), "-o", str(out), "--jsonl", str(tmp_path / jsonl)]) == 2
    captured = capsys.readouterr()
    assert "kept" not in captured.out  # refused before filtering
    assert captured.err.count("\n") == 1 and message in captured.err and not out.exists()
