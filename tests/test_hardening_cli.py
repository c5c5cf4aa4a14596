"""Hardening of `palaestra eval`'s input: every bad flag, URL, model or path is one line and exit 2.

The rule for a user error: exactly one line on stderr starting ``palaestra: error:``, exit status
2, no traceback, and nothing half-written (no run folder under ``-o``). Servers run on a thread of
their own so that ``main`` runs on the main thread, as it does from a terminal.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from palaestra.cli import main
from palaestra.clients.openai import OpenAIClient
from palaestra.testing import FakeOpenAIServer, reverse_reply
from palaestra.testing import served_in_thread as served

ORACLE = "scripted:reverse_text:oracle"


def eval_args(out: Path, *extra: str, model: str = ORACLE) -> list[str]:
    return ["eval", "reverse_text", "-m", model, "-n", "1", "-r", "1", "-o", str(out), "--quiet", *extra]


def assert_one_line_error(err: str, *fragments: str) -> None:
    assert err.startswith("palaestra: error:"), err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


@pytest.fixture(autouse=True)
def _no_ambient_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


# --- flags and JSON inputs ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["-t", "99999999999999999999999"], ["max_tokens"]),
        (["--seed", str(2**86)], ["--seed", str(2**86)]),
        (["-S", '{"max_tokens": "x"}'], ["max_tokens"]),
        (["-T", "-1"], ["temperature", ">= 0"]),
        (["-T", "nan"], ["temperature", "finite"]),
        (["-S", '{"top_p": 5}'], ["top_p"]),
        (["-S", '{"temperature": "hot"}'], ["temperature", "hot"]),
        (["-S", '{"stop": 5}'], ["stop"]),
        (["-S", '{"logprobs": "yes"}'], ["logprobs"]),
        (["-a", '{"num_examples": 99999999999999999999999}'], ["-a", "64-bit"]),
        (["-a", '{"seed": -99999999999999999999999}'], ["-a", "64-bit"]),
    ],
)
def test_bad_numbers_and_sampling_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragments: list[str]
) -> None:
    out = tmp_path / "out"
    assert main(eval_args(out, *extra)) == 2
    assert_one_line_error(capsys.readouterr().err, *fragments)
    assert not out.exists()


def test_more_examples_than_the_dataset_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = ["eval", "reverse_text", "-m", ORACLE, "-a", '{"num_examples": 10}', "-n", "2000", "-o", str(out)]
    assert main(argv) == 2
    assert_one_line_error(capsys.readouterr().err, "asked for 2000 examples but the dataset has 10")
    assert not out.exists()


def test_an_unknown_env_arg_with_a_newline_is_still_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(eval_args(out, "-a", '{"bad\\nkey": 1}')) == 2
    assert_one_line_error(capsys.readouterr().err, "bad", "key", "it takes: num_examples")
    assert not out.exists()


# --- base URLs and servers --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://127.0.0.1/v1", "the base URL must look like http://HOST:PORT/v1"),
        ("notaurl", "the base URL must look like http://HOST:PORT/v1"),
        ("http://127.0.0.1:99999/v1", "has a bad port"),
    ],
)
def test_bad_base_urls_name_the_url_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, fragment: str
) -> None:
    out = tmp_path / "out"
    assert main(eval_args(out, "-b", url, model="gpt-x")) == 2
    err = capsys.readouterr().err
    assert_one_line_error(err, fragment, repr(url))
    assert "API key" not in err
    assert not out.exists()


def test_a_server_that_never_answers_is_reported_with_the_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the pre-run check's own wait (10 s by default), shortened so the test is quick
    monkeypatch.setattr(OpenAIClient.check, "__defaults__", (0.5,))
    out = tmp_path / "out"
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts TCP (backlog), never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        code = main(eval_args(out, "-b", url, "--request-timeout", "0.5", model="gpt-x"))
    assert code == 2
    assert_one_line_error(capsys.readouterr().err, f"{url} did not answer within 0.5s")
    assert not out.exists()


def test_a_folder_that_is_not_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    for model in ("..", str(empty)):
        assert main(eval_args(tmp_path / "out", model=model)) == 2
        assert_one_line_error(capsys.readouterr().err, repr(model), "not a model")
    assert not (tmp_path / "out").exists()


def test_an_empty_key_variable_points_to_no_api_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(eval_args(tmp_path / "out", "-k", "", model="gpt-x")) == 2
    assert_one_line_error(capsys.readouterr().err, "-k", "--no-api-key")


def test_no_api_key_reaches_a_non_loopback_looking_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        socket.create_server(("127.0.0.2", 0)).close()
    except OSError:
        pytest.skip("127.0.0.2 cannot be bound here")
    with served(reverse_reply, host="127.0.0.2") as server:
        url = server.base_url  # 127.0.0.2 is not in the client's loopback list: a key is required
        assert main(eval_args(tmp_path / "a", "-b", url, model=server.model)) == 2
        assert_one_line_error(capsys.readouterr().err, "no API key", "--no-api-key")
        assert server.request_count == 0 and not (tmp_path / "a").exists()
        assert main(eval_args(tmp_path / "b", "-b", url, "--no-api-key", model=server.model)) == 0
        assert server.request_count == 1


def test_a_model_the_server_does_not_serve_fails_before_any_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with served(reverse_reply) as server:
        code = main(eval_args(tmp_path / "out", "-b", server.base_url, model="wrong-name"))
        assert server.request_count == 0
    assert code == 2
    assert_one_line_error(capsys.readouterr().err, "does not serve the model 'wrong-name'", server.model)
    assert not (tmp_path / "out").exists()


def test_an_explicit_base_url_is_used_even_for_the_default_model_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_local(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a local model was loaded although -b was given")

    monkeypatch.setattr("palaestra.cli.common.load_local", no_local)
    with served(reverse_reply, model="smollm2") as server:
        url = server.base_url
        argv = ["eval", "reverse_text", "-m", "smollm2", "-b", server.base_url, "-n", "2", "-r", "2"]
        code = main([*argv, "-o", str(tmp_path), "--quiet"])
        assert code == 0, capsys.readouterr().err
        assert server.request_count == 4
        assert {body["model"] for body in server.requests} == {"smollm2"}
    (run_dir,) = (tmp_path / "evals").glob("*/*")
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert (meta["model"], meta["base_url"], meta["status"]) == ("smollm2", url, "complete")
    assert meta["summary"]["reward"]["mean"] == 1.0  # the server reversed the text: it was used


# --- --save-dataset ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["under_a_file", "an_existing_file"])
def test_a_bad_dataset_path_fails_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    target = a_file / "ds" if case == "under_a_file" else a_file
    out = tmp_path / "out"
    assert main(eval_args(out, "--save-dataset", str(target))) == 2
    assert_one_line_error(capsys.readouterr().err, "--save-dataset", str(target))
    assert not out.exists()  # nothing ran
    assert a_file.read_text() == "keep me"


# --- calling main from a thread ---------------------------------------------------------------


async def test_eval_runs_when_main_is_called_from_a_worker_thread(tmp_path: Path) -> None:
    # the documented way for async tests (and e.g. notebooks) to drive the synchronous CLI
    async with FakeOpenAIServer(reverse_reply) as server:
        code = await asyncio.to_thread(main, eval_args(tmp_path, "-b", server.base_url, model=server.model))
    assert code == 0
    assert server.request_count == 1
