"""EnvGroup: a mixture of reverse_text, double_check and tictactoe through eval, resume and RL."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.cli import main
from palaestra.data.filter import Condition, filter_rollouts
from palaestra.data.rollouts import rollouts_to_rows
from palaestra.envs.group import EnvGroup, load_environment, schedule
from palaestra.train.rl_rollouts import step_examples

ENVS = {
    "reverse_text": {"num_examples": 4},
    "double_check": {"num_examples": 3},
    "tictactoe": {"num_examples": 2},
}
POLICY = '''
import random
import double_check, reverse_text
from tictactoe.players import heuristic_player

def mixed(messages, rng: random.Random) -> str:
    """A policy for the three environments: it tells them apart by their system prompts."""
    system = messages[0]["content"]
    if "reversed_text" in system:
        return reverse_text.oracle(messages)
    if "tic-tac-toe" in system.lower():
        return heuristic_player(messages, rng)
    return double_check.doubter(messages, rng)
'''


@pytest.fixture
def policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "group_policy.py").write_text(POLICY)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("group_policy", None)
    import group_policy

    return group_policy.mixed


def test_rows_are_interleaved_each_once_or_mixed_by_weight() -> None:
    assert schedule({"a": 3, "b": 1, "c": 2}) == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2)]
    mixed = schedule({"a": 100, "b": 10}, {"a": 3, "b": 1})
    counts = Counter(name for name, _ in mixed)
    assert counts["a"] == 3 * counts["b"] and {i for n, i in mixed if n == "a"} == set(range(100))
    for start in range(0, len(mixed) - 8, 8):  # every batch of 8 consecutive rows holds the mix
        assert Counter(n for n, _ in mixed[start : start + 8]) == {"a": 6, "b": 2}
    group = load_environment(ENVS, weights={"reverse_text": 2, "double_check": 1, "tictactoe": 1})
    batch = step_examples(group.examples, step=3, count=8)  # what an RL step takes
    assert Counter(e.env for e in batch) == {"reverse_text": 4, "double_check": 2, "tictactoe": 2}


async def test_each_row_runs_and_scores_as_its_environment_alone(policy: Any) -> None:
    group = load_environment(ENVS)
    assert [e.env for e in group.examples[:4]] == [
        "reverse_text",
        "double_check",
        "tictactoe",
        "reverse_text",
    ]
    client = pa.ScriptedClient(policy)
    spec = pa.RunSpec(rollouts_per_example=2, seed=7)
    together = await group.run(client, spec)
    for name, args in ENVS.items():
        alone = await pa.load_environment(name, **args).run(client, spec)
        own = [r for r in together if r.env == name]
        assert [(r.reward, r.completion) for r in own] == [(r.reward, r.completion) for r in alone]
        for mine, theirs in zip(own, alone, strict=True):
            assert {k: v for k, v in mine.metrics.items() if k in theirs.metrics} == theirs.metrics
    columns = {tuple(sorted(r.metrics)) for r in together if r.reward is not None}
    assert columns == {tuple(group.metric_names())}  # every scored row has every metric
    assert {r.example_id for r in together} == set(range(len(group.examples)))


async def test_a_sampling_override_keeps_each_environments_own_settings() -> None:
    seen: list[tuple[str, Any, Any]] = []

    class Spy(pa.ScriptedClient):
        async def chat(self, messages: Any, *, tools: Any = None, sampling: pa.Sampling) -> pa.ModelResponse:
            seen.append((messages[0]["content"][:20], sampling.temperature, sampling.max_tokens))
            return await super().chat(messages, tools=tools, sampling=sampling)

    group = load_environment({"reverse_text": {"num_examples": 1}, "tictactoe": {"num_examples": 1}})
    tictactoe_tokens = group.envs["tictactoe"].sampling.max_tokens
    await group.run(Spy(lambda messages: "x"), pa.RunSpec(sampling=pa.Sampling(temperature=0.25)))
    assert {t for _, t, _ in seen} == {0.25}
    assert tictactoe_tokens in {m for _, _, m in seen}  # not replaced by the override's None
    seen.clear()
    await group.run(Spy(lambda messages: "x"), pa.RunSpec())
    assert {t for _, t, _ in seen} == {group.envs[n].sampling.temperature for n in group.envs}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_eval_and_resume_of_a_group(policy: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    args = [
        "eval",
        "group",
        "-a",
        json.dumps({"envs": ENVS}),
        "-m",
        "scripted:group_policy:mixed",
        "-n",
        "-1",
        "-r",
        "2",
        "-o",
        out_dir,
        "--quiet",
    ]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    assert "per environment" in out
    (run_dir,) = (out_dir / "evals").glob("*/*")
    full = pa.load_run(run_dir)
    by_env = full.metadata.summary["by_env"]
    assert {n: s["n_rollouts"] for n, s in by_env.items()} == {
        "reverse_text": 8,
        "double_check": 6,
        "tictactoe": 4,
    }
    assert by_env["reverse_text"]["reward"]["mean"] == 1.0  # the oracle
    assert set(by_env["reverse_text"]["metrics"]) == {"format_reward", "lcs_reward"}  # its own only
    assert set(by_env["tictactoe"]["metrics"]) >= {"won", "drew", "lost"}
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len({tuple(sorted(r["metrics"])) for r in rows if r["reward"] is not None}) == 1  # same columns
    assert Counter(r["env"] for r in rows) == {"reverse_text": 8, "double_check": 6, "tictactoe": 4}
    games = filter_rollouts(full.rollouts, [Condition.parse('env == "tictactoe" and lost == 0')]).kept
    assert games and all(r.env == "tictactoe" and r.metrics["lost"] == 0 for r in games)
    assert rollouts_to_rows(full.rollouts[:1])[0]["env"] == full.rollouts[0].env
    report = tmp_path / "report.html"
    assert run_cli(capsys, "report", run_dir, "-o", report)[0] == 0
    assert "Per environment" in report.read_text()

    # interrupted after 5 groups: resume runs the other 4 and ends where the full run ended
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    (run_dir / "results.jsonl").write_text("\n".join(lines[:10]) + "\n")
    meta = json.loads((run_dir / "metadata.json").read_text())
    meta["status"] = "interrupted"
    (run_dir / "metadata.json").write_text(json.dumps(meta))
    code, out, err = run_cli(
        capsys, "eval", "--resume", run_dir, "-m", "scripted:group_policy:mixed", "--quiet"
    )
    assert code == 0, err
    resumed = pa.load_run(run_dir)
    assert resumed.metadata.summary["by_env"] == by_env
    assert [(r.example_id, r.env, r.reward) for r in resumed.rollouts] == [
        (r.example_id, r.env, r.reward) for r in full.rollouts
    ]


@pytest.mark.parametrize(
    ("env_args", "message"),
    [
        ({"envs": {"nope": {}}}, "unknown environment 'nope'"),
        ({"envs": {"reverse_text": {"colour": 1}}}, "does not take 'colour'"),
        ({"envs": "reverse_text"}, "envs must be a JSON object"),
        ({"envs": {"reverse_text": {}}, "weights": {"tictactoe": 1}}, "weights must name exactly"),
        ({"envs": {"reverse_text": {}}, "weights": {"reverse_text": 0}}, "weights must be positive"),
    ],
)
def test_a_bad_group_is_one_clear_error(
    env_args: dict[str, Any], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys,
        "eval",
        "group",
        "-a",
        json.dumps(env_args),
        "-m",
        "scripted:reverse_text:oracle",
        "-o",
        tmp_path,
    )
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "evals").exists()


def test_a_group_needs_environments() -> None:
    with pytest.raises(ValueError, match="at least one environment"):
        EnvGroup({})
    with pytest.raises(TypeError, match="not an Environment"):
        EnvGroup({"x": object()})  # type: ignore[dict-item]  # the mistake under test


@pytest.mark.slow
def test_the_rl_trainer_trains_on_a_group(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    config = tmp_path / "rl.toml"
    config.write_text(f"""
[model]
path = "{tiny_model_dir}"

[env]
id = "group"
args = {{envs = {{reverse_text = {{num_examples = 8}}, double_check = {{num_examples = 8}}}}}}

[sampling]
max_tokens = 8

[train]
steps = 1
batch_size = 8
rollouts_per_example = 2
threads = 1

[eval]
num_examples = 4

[output]
dir = "{tmp_path / "run"}"
""")
    code, _, err = run_cli(capsys, "train", "rl", config, "--quiet")
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"reward/reverse_text", "reward/double_check"} <= set(records[-1])


def test_the_first_rows_tools_are_the_groups_for_a_template_check() -> None:
    group = load_environment({"sql_quiz": {}, "reverse_text": {"num_examples": 2}})
    assert group.tool_schemas() == pa.load_environment("sql_quiz").tool_schemas()
    assert group.tool_schemas()  # sql_quiz has tools
    assert load_environment({"reverse_text": {"num_examples": 2}}).tool_schemas() is None
