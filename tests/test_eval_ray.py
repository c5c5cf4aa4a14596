"""``palaestra eval --executor ray``: Ray workers on a local cluster (loopback, one per module) run
the groups, the driver saves them; the run is the one-process run's, a worker killed mid-run
(``ray.kill``, SIGKILL) loses and duplicates nothing, and bad input is one line."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.cli import main
from palaestra.cli.common import ClientOptions
from palaestra.eval.ray_executor import RayExecutor
from palaestra.testing.server import FakeOpenAIServer, echo_reply, served_in_thread

ray = pytest.importorskip("ray")
pytest.importorskip("tictactoe")

N, R = 24, 2  # tic-tac-toe games: 24 groups of 2


async def slow_echo(body: dict[str, Any]) -> str:
    await asyncio.sleep(0.02)  # groups stay in flight long enough to be cut short by a kill
    return echo_reply(body)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One local Ray cluster on loopback for the module (starting one takes seconds)."""
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with served_in_thread(slow_echo, record_requests=False) as fake:
        yield fake


@pytest.fixture(scope="module")
def one_process(server: FakeOpenAIServer) -> pa.EvalRun:
    """The reference: the same run on this process's engine."""
    return run(server, None)


def options(server: FakeOpenAIServer) -> ClientOptions:
    return ClientOptions("fake-model", base_url=server.base_url, no_api_key=True, max_retries=0)


def run(server: FakeOpenAIServer, executor: Any, output_dir: Path | None = None, **kwargs: Any) -> pa.EvalRun:
    async def go() -> pa.EvalRun:
        env = pa.load_environment("tictactoe")
        client = pa.OpenAIClient("fake-model", base_url=server.base_url, api_key="")
        try:
            spec = pa.RunSpec(num_examples=N, rollouts_per_example=R, max_concurrent=8, seed=3)
            return await pa.evaluate(
                env, client, spec, output_dir=output_dir, env_id="tictactoe", executor=executor, **kwargs
            )
        finally:
            await client.aclose()

    return asyncio.run(go())


def comparable(eval_run: pa.EvalRun) -> tuple[Any, list[Any]]:
    """The summary and the rollouts, without their timings (which differ run to run)."""
    summary = {k: v for k, v in eval_run.summary.items() if k != "timing"}
    rows = [(r.example_id, r.rollout_index, r.reward, r.metrics, r.messages) for r in eval_run.rollouts]
    return summary, rows


def test_the_cli_runs_on_ray_workers_and_saves_the_one_process_run(
    cluster: None, server: FakeOpenAIServer, one_process: pa.EvalRun, tmp_path: Path
) -> None:
    code = main(
        [
            "eval",
            "tictactoe",
            "-m",
            "fake-model",
            "-b",
            server.base_url,
            "--no-api-key",
            "-n",
            str(N),
            "-r",
            str(R),
            "-c",
            "8",
            "--seed",
            "3",
            "--executor",
            "ray",
            "--workers",
            "2",
            "--quiet",
            "-o",
            str(tmp_path),
        ]
    )
    assert code == 0
    (folder,) = (tmp_path / "evals" / "tictactoe--fake-model").iterdir()
    saved = pa.load_run(folder)
    assert saved.metadata.status == "complete" and not saved.skipped
    assert comparable(saved) == comparable(one_process)
    lines = (folder / "results.jsonl").read_text().splitlines()
    assert len(lines) == N * R  # the driver alone wrote them, each group once


@pytest.mark.parametrize("kill", ["ray.kill", "SIGKILL"])
def test_a_worker_killed_mid_run_has_its_groups_rerun_elsewhere(
    cluster: None, server: FakeOpenAIServer, one_process: pa.EvalRun, tmp_path: Path, kill: str
) -> None:
    executor = RayExecutor("tictactoe", {}, options(server), workers=2)
    seen: list[pa.Rollout] = []

    def on_rollout(rollout: pa.Rollout) -> None:
        seen.append(rollout)
        if len(seen) == R:  # the first group is back: the others are in flight on both workers
            if kill == "ray.kill":
                ray.kill(executor.live[0])
            else:
                os.kill(executor.stats.pids[0], signal.SIGKILL)

    saved = run(server, executor, tmp_path, on_rollout=on_rollout)
    assert executor.stats.died == 1 and executor.stats.rerun >= 1 and executor.stats.started == 3
    keys = [(r.example_id, r.rollout_index) for r in saved.rollouts]
    assert len(keys) == len(set(keys)) == N * R  # nothing lost, nothing twice
    assert saved.path is not None and len((saved.path / "results.jsonl").read_text().splitlines()) == N * R
    assert comparable(saved) == comparable(one_process)


class Stop(Exception):
    pass


def test_a_run_stopped_mid_way_resumes_on_ray_to_the_one_process_run(
    cluster: None, server: FakeOpenAIServer, one_process: pa.EvalRun, tmp_path: Path
) -> None:
    done: list[pa.Rollout] = []

    def stop(rollout: pa.Rollout) -> None:
        done.append(rollout)
        if len(done) == 5 * R:
            raise Stop  # the driver stops (as Ctrl-C stops it): the groups saved so far stay

    with pytest.raises(Stop):
        run(server, RayExecutor("tictactoe", {}, options(server), workers=1), tmp_path, on_rollout=stop)
    (folder,) = (tmp_path / "evals" / "tictactoe--fake-model").iterdir()
    assert pa.load_run(folder).metadata.status == "interrupted"
    assert len((folder / "results.jsonl").read_text().splitlines()) == 5 * R
    resumed = run(server, RayExecutor("tictactoe", {}, options(server), workers=1), resume=folder)
    assert resumed.metadata.status == "complete"
    assert comparable(resumed) == comparable(one_process)


def test_bad_executors_are_one_line_and_write_nothing(
    server: FakeOpenAIServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = [
        "eval",
        "tictactoe",
        "-m",
        "fake-model",
        "-b",
        server.base_url,
        "--no-api-key",
        "-o",
        str(tmp_path),
    ]
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main([*base, "--executor", f"ray=127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"palaestra: error: --executor ray=127.0.0.1:{port}: no Ray cluster answers there")
    assert err.count("\n") == 1
    assert main([*base, "--executor", "dask"]) == 2
    assert "expected local, ray or ray=ADDRESS" in capsys.readouterr().err
    assert main([*base, "--workers", "2"]) == 2
    assert "--workers is for --executor ray" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    assert main([*base, "--executor", "ray"]) == 2
    assert (
        capsys.readouterr().err
        == "palaestra: error: --executor ray needs Ray: pip install 'palaestra[ray]'\n"
    )
    assert not (tmp_path / "evals").exists()


def test_a_node_without_the_environment_says_which_and_where_and_writes_nothing(
    cluster: None,
    server: FakeOpenAIServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = pa.load_environment  # "only_here" is installed in this process only, not on the workers
    monkeypatch.setattr(
        pa, "load_environment", lambda name, **kw: real("tictactoe" if name == "only_here" else name, **kw)
    )
    code = main(
        [
            "eval",
            "only_here",
            "-m",
            "fake-model",
            "-b",
            server.base_url,
            "--no-api-key",
            "-n",
            "2",
            "--executor",
            "ray",
            "--workers",
            "1",
            "-o",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "the rollout worker on node " in err and "cannot load environment 'only_here'" in err
    assert "install its package on that node" in err
    assert not (tmp_path / "evals").exists()
    code = main(
        [
            "eval",
            "tictactoe",
            "-m",
            "fake-model",
            "-b",
            server.base_url,
            "--no-api-key",
            "--executor",
            "ray",
            "--workers",
            "9",
            "-o",
            str(tmp_path),
        ]
    )
    assert code == 2 and "--workers 9: the Ray cluster has 4 CPUs, one per worker" in capsys.readouterr().err
    assert not (tmp_path / "evals").exists()
