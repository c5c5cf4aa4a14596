"""Property tests of the inputs a user or a damaged disk hands palaestra: the CLI's JSON flags
and saved runs. Whatever the input, the answer is a result or one clear line, never a traceback.

Hypothesis runs derandomized (the same examples every run) and few enough to stay quick.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from palaestra.cli import main
from palaestra.eval.store import RunStoreError, load_run

ORACLE = "scripted:reverse_text:oracle"
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Integers small enough to run quickly (no env asked to build a million examples) or too big for
# any saved run (beyond 64 bits); floats include NaN and infinities, which JSON text can carry.
INTS = st.one_of(st.integers(-5, 20), st.integers(2**64, 2**70), st.integers(-(2**70), -(2**64)))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, st.floats(), st.text(max_size=12))
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def objects(known: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects whose keys are mostly ones the flag knows, with values of any JSON type."""
    return st.dictionaries(st.one_of(st.sampled_from(known), st.text(max_size=8)), JSON, max_size=4)


def flag_text(known: list[str]) -> st.SearchStrategy[str]:
    """What a user might type after the flag: JSON of any shape (NaN included), or any text."""
    return st.one_of(
        objects(known).map(json.dumps),
        JSON.map(json.dumps),
        st.text(max_size=30),
    )


@contextlib.contextmanager
def captured() -> Iterator[dict[str, str]]:
    out, err = io.StringIO(), io.StringIO()
    result: dict[str, str] = {}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield result
    result.update(out=out.getvalue(), err=err.getvalue())


def run_main(argv: list[str]) -> tuple[int, str]:
    with captured() as io_:
        code = main(argv)
    return code, io_["err"]


def assert_result_or_one_line(code: int, err: str) -> None:
    assert code in (0, 2), (code, err)
    event(f"exit {code}")
    if code == 2:
        assert err.startswith("palaestra: error:") and err.count("\n") == 1, err
        assert "Traceback" not in err


@pytest.fixture(scope="module", autouse=True)
def _no_ambient_key() -> Iterator[None]:
    """No API key: a saved run naming a remote model must fail on the key, never go online."""
    saved = os.environ.pop("OPENAI_API_KEY", None)
    yield
    if saved is not None:
        os.environ["OPENAI_API_KEY"] = saved


# --- the CLI's JSON flags ---------------------------------------------------------------------


@FUZZ
@given(text=flag_text(["num_examples", "seed", "system_prompt"]))
def test_env_args_are_run_or_refused_in_one_line(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        argv = ["eval", "reverse_text", "-m", ORACLE, "-n", "1", "-r", "1", "-o", str(out), "--quiet"]
        code, err = run_main([*argv, f"--env-args={text}"])
        assert_result_or_one_line(code, err)
        if code == 2:
            assert not out.exists()  # nothing half-written
        else:
            assert len(load_run(next((out / "evals").glob("*/*"))).rollouts) == 1


SAMPLING_KEYS = ["temperature", "top_p", "max_tokens", "stop", "seed", "logprobs", "extra", "top_k"]


@FUZZ
@given(text=flag_text(SAMPLING_KEYS))
def test_sampling_args_are_run_or_refused_in_one_line(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        argv = ["eval", "reverse_text", "-m", ORACLE, "-n", "1", "-r", "1", "-o", str(out), "--quiet"]
        code, err = run_main([*argv, f"--sampling={text}"])
        assert_result_or_one_line(code, err)
        if code == 2:
            assert not out.exists()
        else:
            assert len(load_run(next((out / "evals").glob("*/*"))).rollouts) == 1


# --- saved runs -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real, complete run of 2 examples × 2 rollouts, copied before each damage."""
    out = tmp_path_factory.mktemp("fuzz-run")
    code, err = run_main(
        ["eval", "reverse_text", "-m", ORACLE, "-n", "2", "-r", "2", "-o", str(out), "--quiet"]
    )
    assert code == 0, err
    return next((out / "evals").glob("*/*"))


@contextlib.contextmanager
def copy_of(run_dir: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / run_dir.name
        shutil.copytree(run_dir, copy)
        yield copy


def assert_report_and_resume_answer(run_dir: Path) -> int:
    """``palaestra report`` and ``palaestra eval --resume`` each give a result or one line."""
    code, err = run_main(["report", str(run_dir), "-o", str(run_dir / "r.html")])
    assert_result_or_one_line(code, err)
    assert (code == 0) == (run_dir / "r.html").is_file()
    code, err = run_main(["eval", "--resume", str(run_dir), "-m", ORACLE, "--quiet"])
    assert_result_or_one_line(code, err)
    return code


LINES = st.one_of(JSON.map(lambda v: json.dumps(v).encode()), st.binary(max_size=40))


@FUZZ
@given(line=LINES)
def test_a_damaged_results_line_is_skipped(saved_run: Path, line: bytes) -> None:
    with copy_of(saved_run) as run_dir:
        results = run_dir / "results.jsonl"
        _, *rest = results.read_bytes().splitlines(keepends=True)
        results.write_bytes(line + b"\n" + b"".join(rest))
        run = load_run(run_dir)
        assert len(run.rollouts) == 3  # the other three are read as saved
        assert len(run.skipped) == sum(1 for part in line.split(b"\n") if part.strip())
        assert assert_report_and_resume_answer(run_dir) == 0
        assert len(load_run(run_dir).rollouts) == 4  # the resume ran the damaged group again


META_FIELDS = [
    "env_id",
    "env_args",
    "model",
    "base_url",
    "num_examples",
    "rollouts_per_example",
    "seed",
    "sampling",
    "pass_threshold",
    "status",
    "summary",
    "counts",
    "run_id",
]


@FUZZ
@given(
    damage=st.one_of(
        JSON.map(lambda v: ("whole", json.dumps(v).encode())),
        st.binary(max_size=40).map(lambda b: ("whole", b)),
        st.tuples(st.sampled_from(META_FIELDS), JSON).map(lambda kv: ("field", kv)),
    )
)
def test_damaged_metadata_is_read_or_refused_in_one_line(saved_run: Path, damage: tuple[str, Any]) -> None:
    with copy_of(saved_run) as run_dir:
        meta_path = run_dir / "metadata.json"
        kind, value = damage
        if kind == "whole":
            meta_path.write_bytes(value)
        else:
            field, new = value
            meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), field: new}))
        try:
            load_run(run_dir)
        except RunStoreError as exc:
            assert "\n" not in str(exc)
        assert_report_and_resume_answer(run_dir)


# --- found by fuzzing single fields of a saved rollout ----------------------------------------

WRONG_TYPES = [("stop_reason", ["answered"]), ("metrics", {"lcs_reward": "high"})]


def give_a_wrongly_typed_field(run_dir: Path, field: str, value: Any) -> None:
    """Example 0's first rollout gets a field of the wrong type; the line is otherwise whole JSON."""
    results = run_dir / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    at = next(i for i, row in enumerate(rows) if (row["example_id"], row["rollout_index"]) == (0, 0))
    rows[at][field] = value
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.parametrize(("field", "value"), WRONG_TYPES)
def test_resume_reruns_a_group_whose_line_has_a_wrongly_typed_field(
    saved_run: Path, field: str, value: Any
) -> None:
    with copy_of(saved_run) as run_dir:
        give_a_wrongly_typed_field(run_dir, field, value)
        code, err = run_main(["eval", "--resume", str(run_dir), "-m", ORACLE, "--quiet"])
        assert code == 0 and "Traceback" not in err
        run = load_run(run_dir)
        assert sorted((r.example_id, r.rollout_index) for r in run.rollouts) == [
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
        ]
        assert all(r.stop_reason == "answered" and r.metrics["lcs_reward"] == 1.0 for r in run.rollouts)
        assert run.metadata.status == "complete"


@pytest.mark.parametrize(("field", "value"), WRONG_TYPES)
def test_report_of_a_run_whose_line_has_a_wrongly_typed_field(
    saved_run: Path, field: str, value: Any
) -> None:
    with copy_of(saved_run) as run_dir:
        give_a_wrongly_typed_field(run_dir, field, value)
        meta = json.loads((run_dir / "metadata.json").read_text())
        del meta["summary"]  # as a killed run has none: the report computes it from the rollouts
        (run_dir / "metadata.json").write_text(json.dumps(meta))
        code, err = run_main(["report", str(run_dir)])
        assert (code, err) == (0, "")
        assert (run_dir / "report.html").is_file()
