"""The `palaestra` command: it runs what the library runs, and bad input is one clear line."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes import default_sigint

from palaestra.cli import main
from palaestra.testing import FakeOpenAIServer, reverse_reply


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "palaestra.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_eval_with_a_scripted_policy_prints_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "eval",
        "reverse_text",
        "-m",
        "scripted:reverse_text:oracle",
        "-n",
        "4",
        "-r",
        "2",
        "-o",
        str(tmp_path),
    ]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0
    assert "8 rollouts" in out
    reward_row = next(line for line in out.splitlines() if line.strip().startswith("reward "))
    assert reward_row.split()[1] == "1.000"  # the oracle is always right
    assert "answered 8" in out


async def test_eval_against_an_http_server(tmp_path: Path) -> None:
    async with FakeOpenAIServer(reverse_reply) as server:
        # the CLI runs its own event loop, so it goes in a subprocess while this loop serves
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "palaestra.cli",
            "eval",
            "reverse_text",
            "-m",
            server.model,
            "-b",
            server.base_url,
            "-n",
            "3",
            "-r",
            "2",
            "-t",
            "100",
            "-T",
            "0.5",
            "-o",
            str(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "6 rollouts" in out.decode()
    assert server.request_count == 6
    assert {(b["max_tokens"], b["temperature"]) for b in server.requests} == {(100, 0.5)}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "no_such_env", "-m", "x"], "unknown environment 'no_such_env'; installed:"),
        (["eval", "reverse_text", "-m", "x", "-a", "{not json"], "-a is not valid JSON"),
        (["eval", "reverse_text", "-m", "x", "-a", "[1]"], "-a must be a JSON object"),
        (["eval", "reverse_text", "-m", "x", "-a", '{"bogus": 1}'], "does not take 'bogus'"),
        (["eval", "reverse_text", "-m", "x", "-a", '{"num_examples": 0}'], "num_examples"),
        (["eval", "reverse_text", "-m", "scripted:nope"], "expected scripted:MODULE:FUNCTION"),
        (["eval", "reverse_text", "-m", "scripted:reverse_text:missing"], "has no function 'missing'"),
        (["eval", "reverse_text", "-m", "x", "-r", "0"], "-r must be at least 1"),
        (["eval", "reverse_text", "-m", "x", "-n", "0"], "no examples to run"),
        (["eval", "reverse_text", "-m", "local:/no/such/model"], "/no/such/model"),
        (
            ["eval", "reverse_text", "-m", "x", "-S", '{"bogus_field": 1, "top_p": "x"}', "-t", "0"],
            "max_tokens",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "unused")  # so only the error under test can fire
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_api_key_fails_before_any_request(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MY_KEY", raising=False)
    code = main(
        ["eval", "reverse_text", "-m", "gpt-x", "-b", "https://api.example.invalid/v1", "-k", "MY_KEY"]
    )
    assert code == 2
    assert "set the environment variable MY_KEY" in capsys.readouterr().err


def test_wrong_flag_and_missing_env_are_usage_errors() -> None:
    bad_flag = run_cli("eval", "reverse_text", "-m", "x", "--no-such-flag")
    assert bad_flag.returncode == 2 and "unrecognized arguments: --no-such-flag" in bad_flag.stderr
    no_env = run_cli("eval", "-m", "x")
    assert no_env.returncode == 2 and "give an environment (or --resume RUN_DIR)" in no_env.stderr
    assert "Traceback" not in bad_flag.stderr + no_env.stderr


def test_envs_lists_the_bundled_environments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["envs"]) == 0
    names = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert {"reverse_text", "double_check"} <= set(names)


def test_init_scaffolds_a_package_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init", "my_env", "--path", str(tmp_path)]) == 0
    assert (tmp_path / "my_env" / "pyproject.toml").is_file()
    assert main(["init", "my_env", "--path", str(tmp_path)]) == 2
    assert "exists" in capsys.readouterr().err


def test_init_into_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parent = tmp_path / "a_file"
    parent.write_text("")
    assert main(["init", "my_env", "--path", str(parent)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("palaestra: error:") and err.count("\n") == 1


async def test_ctrl_c_stops_cleanly_with_exit_130(tmp_path: Path) -> None:
    started = asyncio.Event()

    async def slow(body: dict) -> str:
        started.set()
        await asyncio.sleep(30)
        return "too late"

    async with FakeOpenAIServer(slow) as server:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "palaestra.cli",
            "eval",
            "reverse_text",
            "-m",
            server.model,
            "-b",
            server.base_url,
            "-n",
            "4",
            "-r",
            "1",
            "-o",
            str(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=default_sigint,
        )
        await asyncio.wait_for(started.wait(), timeout=60)
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 130
    (run_dir,) = (tmp_path / "evals").glob("*/*")
    assert err.decode().strip() == f"interrupted; resume with: palaestra eval --resume {run_dir}"
    assert '"status": "interrupted"' in (run_dir / "metadata.json").read_text()


def test_serve_with_a_missing_model_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "local:/no/such/model", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("palaestra: error:") and "/no/such/model" in err and err.count("\n") == 1
