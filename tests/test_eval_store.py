"""RunMetadata and the one reader of saved runs: typed, round-tripped, old layouts, clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.eval.store import RunMetadata, RunStore, RunStoreError, load_run

# metadata.json as palaestra 0.1.0 wrote it before RunMetadata existed
OLD = {
    "run_id": "20261129-101500-abcdef",
    "env_id": "toy",
    "env_args": {"k": 1},
    "model": "m",
    "base_url": None,
    "api_key_var": None,
    "sampling": {
        "temperature": 0.7,
        "top_p": None,
        "max_tokens": 64,
        "stop": None,
        "seed": None,
        "logprobs": False,
        "extra": {},
    },
    "num_examples": 4,
    "rollouts_per_example": 2,
    "max_concurrent": 8,
    "seed": 3,
    "pass_threshold": 0.5,
    "versions": {"palaestra": "0.1.0"},
    "started_at": "2026-11-29T10:15:00Z",
    "finished_at": None,
    "status": "interrupted",
    "counts": {"expected": 8, "saved": 0, "errors": 0},
}


def test_metadata_round_trips_and_keeps_the_saved_layout() -> None:
    meta = RunMetadata.from_dict(OLD)
    assert meta.spec == pa.RunSpec(
        num_examples=4,
        rollouts_per_example=2,
        max_concurrent=8,
        seed=3,
        sampling=pa.Sampling(temperature=0.7, max_tokens=64),
    )
    assert (meta.env_id, meta.model, meta.status, meta.env_args) == ("toy", "m", "interrupted", {"k": 1})
    # the same JSON as before, keys in the same order, plus what later versions added
    assert meta.to_dict() == {**OLD, "max_failures_in_a_row": 20, "rubric": {}, "summary": {}}
    assert [k for k in meta.to_dict() if k in OLD] == list(OLD)
    assert RunMetadata.from_dict(meta.to_dict()) == meta


def test_fields_of_later_versions_are_ignored() -> None:
    assert RunMetadata.from_dict({**OLD, "added_later": [1]}) == RunMetadata.from_dict(OLD)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_examples": "ten"}, "num_examples must be an integer"),
        ({"seed": 2**70}, "seed must be an integer in [0, 2**63)"),
        ({"env_args": [1]}, "'env_args' is not an object"),
        ({"sampling": "hot"}, "'sampling' is not an object"),
        ({"sampling": {"temperature": "hot"}}, "temperature must be a finite number"),
        ({"sampling": {"warmth": 1}}, "unknown sampling keys: warmth"),
        ({"model": None}, "'model' is missing or not a string"),
        ({"status": "done"}, "'status' must be one of"),
        ({"summary": 3}, "'summary' is not an object"),
    ],
)
def test_malformed_metadata_is_one_clear_line(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text("")
    (run / "metadata.json").write_text(json.dumps({**OLD, **change}))
    with pytest.raises(RunStoreError, match=r"metadata\.json: malformed") as info:
        load_run(run)
    assert message in str(info.value) and "\n" not in str(info.value)


async def test_load_run_reads_what_evaluate_saved_and_names_unreadable_lines(tmp_path: Path) -> None:
    env = pa.SingleTurnEnv(dataset=[{"question": f"q{i}"} for i in range(3)], rubric=pa.Rubric([lambda: 1.0]))
    spec = pa.RunSpec(num_examples=3, rollouts_per_example=2, seed=9)
    saved = await pa.evaluate(env, pa.ScriptedClient(lambda: "a", model="m"), spec, output_dir=tmp_path)
    assert saved.path is not None
    with (saved.path / "results.jsonl").open("a") as f:
        f.write('"a string, not a rollout"\n{"example_id": 1, "torn')
    run = load_run(saved.path)
    assert run.metadata.spec == spec.replace(sampling=env.sampling) and run.metadata.status == "complete"
    assert [r.to_dict() for r in run.rollouts] == [r.to_dict() for r in saved.rollouts]
    assert run.skipped == [7, 8] and run.summary == saved.summary
    assert RunStore.open(saved.path).read_metadata() == run.metadata
