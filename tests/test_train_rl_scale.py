"""RL sampling scaled out, against one remote sampler (``palaestra serve --enable-weight-sync``,
LoRA sync: a fresh model name per version): 2 torchrun ranks (gloo) sharing it, and Ray workers
rolling out the groups. Both take the very steps of the one-process run with that sampler, for the
same seed (the server samples each seeded request alike whatever shares its batch); a server that
dies mid-run stops every rank with one line and a resumable run; a Ray worker killed mid-step has
its groups run again elsewhere, and with every worker gone the run stops in one line; 2 ranks
whose groups rank 0's Ray workers roll out take the same steps, and so do 2 ranks sampling a step
ahead; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.cli import main

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_train_rl_remote import assert_same_figures, figures, free_port, records, remote, serve_command  # noqa: E402
from toy_rl_env import load  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each process on one thread (ranks, servers and Ray workers inherit the variable)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def toy_config(path: Path, model: Path, out: Path, sampler: str) -> Path:
    """Two steps of 4 groups of 2 toy rollouts, LoRA (step 2 asks for the adapter step 1 pushed), a
    held-out set played before and after (the last push is every rank's)."""
    path.write_text(f"""
[model]
path = "{model}"
[env]
id = "toy"
args = {{num_examples = 8}}
[sampling]
max_tokens = 8
[optim]
lr = 1e-2
[lora]
enabled = true
rank = 4
target_modules = ["q_proj", "v_proj"]
[train]
steps = 2
batch_size = 8
rollouts_per_example = 2
max_concurrent = 4
threads = 1
[eval]
num_examples = 2
sets = [{{name = "held-out", args = {{num_examples = 2, seed = 100}}}}]
[output]
dir = "{out}"
sample_every = 1
sample_groups = 4
{sampler}
""")
    return path


def served(port: int) -> str:
    return remote(port, command=serve_command(port))


@pytest.fixture(autouse=True)
def toy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from palaestra.train import rl_rollouts

    monkeypatch.setattr(rl_rollouts, "load_environment", load)


@pytest.fixture(scope="module")
def one_process(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the run in one process, sampled by the remote sampler."""
    from palaestra.train import rl_rollouts

    out = tmp_path_factory.mktemp("one-process")
    port = free_port()
    config = toy_config(out / "rl.toml", tiny_model_dir, out / "run", served(port))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        patch.setattr(rl_rollouts, "load_environment", load)
        assert main(["train", "rl", str(config), "--quiet"]) == 0
    return out / "run"


def assert_same_run(run: Path, reference: Path) -> None:
    a, b = figures(reference), figures(run)
    assert [r["step"] for r in b] == [0, 1, 2] and [r.get("policy_version") for r in b] == [None, 0, 1]
    assert b[1]["groups"] == 4 and b[1]["zero_groups"] < 4 and "loss" in b[1]  # something was learnt
    assert b[1]["errors"] == 0 and b[2]["errors"] == 0
    assert_same_figures(a, b)  # the same samples (seeded), the same update, to float noise
    for step in (1, 2):  # the very tokens: every group of the batch is in the saved sample
        name = f"step-{step:06d}"
        ids, logprobs = sampled(run / "samples" / name)
        ref_ids, ref_logprobs = sampled(reference / "samples" / name)
        assert ids == ref_ids and logprobs == pytest.approx(ref_logprobs, abs=1e-4)


def sampled(folder: Path) -> tuple[list[Any], list[float]]:
    """The saved rollouts' prompt and sampled token ids by example and rollout, and their logprobs."""
    rows = sorted(pa.load_run(folder).rollouts, key=lambda r: (r.example_id, r.rollout_index))
    assert len(rows) == 8 and all(t.token_ids for r in rows for t in r.turns)
    ids = [
        (r.example_id, r.rollout_index, [(t.prompt_token_ids, t.token_ids) for t in r.turns]) for r in rows
    ]
    return ids, [x for r in rows for t in r.turns for x in t.logprobs or []]


RANKS = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc-per-node",
    "2",
    str(HERE / "distributed_toy_rl.py"),
]


def test_two_ranks_share_one_remote_sampler_and_take_the_one_process_steps(
    tiny_model_dir: Path, tmp_path: Path, one_process: Path
) -> None:
    port = free_port()
    config = toy_config(tmp_path / "rl.toml", tiny_model_dir, tmp_path / "run", served(port))
    done = subprocess.run(
        [*RANKS, "train", "rl", str(config), "--quiet"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert_same_run(tmp_path / "run", one_process)
    assert len((tmp_path / "run" / "sampler.log").read_text().splitlines()) > 0  # rank 0 alone ran it
    assert sorted(p.name for p in (tmp_path / "run" / "sampler").glob("adapter-v*")) == ["adapter-v2"]


@pytest.mark.parametrize("ahead", [1, 2])
def test_two_ranks_sampling_ahead_push_together_and_one_step_ahead_take_the_one_process_steps(
    tiny_model_dir: Path, tmp_path: Path, ahead: int
) -> None:
    """``train.max_off_policy_steps = k``: the next batches are sampled while the ranks train, with
    the weights the server has; rank 0 samples all of them and pushes when it finds the server idle,
    and says so to the other rank, so both push at the same points. At k = 1 that is the same
    schedule as in one process (steps 2 and 3 one step behind), so the steps are the same; at k = 2
    whether the server is idle is a matter of timing (rank 1 always finds it idle: it samples
    nothing), so the check is that the ranks agree and every batch is at most k steps behind."""
    steps = ["--train.max_off_policy_steps", str(ahead), "--train.steps", str(ahead + 2)]
    config = toy_config(tmp_path / "rl.toml", tiny_model_dir, tmp_path / "run", served(free_port()))
    done = subprocess.run(
        [*RANKS, "train", "rl", str(config), "--quiet", *steps], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    two = figures(tmp_path / "run")
    stale = [r.get("off_policy_steps") for r in two[1:]]
    assert [r["step"] - 1 - r["policy_version"] for r in two[1:]] == stale and max(stale) <= ahead
    assert stale[: ahead + 1] == list(range(ahead + 1))  # step k+1's batch was started before step 1 trained
    for record in two[1:]:  # every saved rollout carries the version that sampled it; a stale one differs
        sample = pa.load_run(tmp_path / "run" / "samples" / f"step-{record['step']:06d}")
        assert {r.policy_version for r in sample.rollouts} == {record["policy_version"]}
        assert (record["mismatch/log_ratio_max"] > 1e-3) is (record["off_policy_steps"] > 0), record
    if ahead > 1:
        return
    alone = tmp_path / "alone"
    config = toy_config(tmp_path / "alone.toml", tiny_model_dir, alone, served(free_port()))
    assert main(["train", "rl", str(config), "--quiet", *steps]) == 0
    one = figures(alone)
    assert stale == [0, 1, 1]
    assert_same_figures(one, two)  # the same samples, the same updates, to float noise
    for step in (1, 2, 3):  # the very tokens of every group
        name = f"step-{step:06d}"
        ids, logprobs = sampled(tmp_path / "run" / "samples" / name)
        ref_ids, ref_logprobs = sampled(alone / "samples" / name)
        assert ids == ref_ids and logprobs == pytest.approx(ref_logprobs, abs=1e-4)


def test_a_server_that_dies_mid_run_stops_both_ranks_in_one_line_and_the_run_resumes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from test_train_rl_remote import write_config

    port, pidfile, run_dir = free_port(), tmp_path / "server.pid", tmp_path / "run"
    sampler = remote(port, command=serve_command(port, pidfile=pidfile))
    # 4 groups of 2 a step, 2 a rank, one request at a time on each: a rank's 5th training reward is
    # its first of step 2, and its second group of step 2 is still to be sampled then
    config = write_config(
        tmp_path / "rl.toml",
        tiny_model_dir,
        run_dir,
        steps=3,
        sampler=sampler,
        env=f', kill_at = 5, pidfile = "{pidfile}"',
        max_concurrent=2,
        rollouts_per_example=2,
    )
    done = subprocess.run(
        [*RANKS, "train", "rl", str(config), "--quiet"], capture_output=True, text=True, timeout=300
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("palaestra: error:")]
    assert done.returncode != 0 and len(errors) == 1, done.stderr
    assert "step 2: the sampler server (sampler.command) was killed by signal 9" in errors[0]
    assert errors[0].endswith(f"the last good checkpoint is {run_dir / 'checkpoints' / 'step-000001'}")
    assert [r["step"] for r in records(run_dir)] == [0, 1]  # step 2, whose batch broke off, was not trained
    # saved by 2 ranks, resumed by one, which starts the server again (nothing kills it this time)
    assert main(["train", "rl", "--resume", str(run_dir), "--env.args", "{num_examples = 8}", "--quiet"]) == 0
    assert [r["step"] for r in records(run_dir)] == [0, 1, 2, 3]
    assert (run_dir / "final").resolve().name == "step-000003"


def test_bad_scale_out_input_is_one_line_and_exit_2_before_anything_is_written(
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()  # nothing listens there
    config = toy_config(tmp_path / "rl.toml", tiny_model_dir, tmp_path / "run", served(port))
    local = toy_config(tmp_path / "local.toml", tiny_model_dir, tmp_path / "run", "")

    def refused(*argv: str) -> str:
        code = main(["train", "rl", *argv])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("palaestra: error:"), err
        assert not (tmp_path / "run").exists()
        return err

    assert "sampler.executor ray=127.0.0.1:1: no Ray cluster answers there" in refused(
        str(config), "--sampler.executor", "ray=127.0.0.1:1"
    )
    assert 'executor ray needs a remote sampler (kind = "vllm")' in refused(
        str(local), "--sampler.executor", "ray"
    )
    assert "expected local, ray or ray=ADDRESS" in refused(str(config), "--sampler.executor", "dask")
    assert "workers (2) is for executor ray" in refused(str(config), "--sampler.workers", "2")
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "ray", None)  # Ray not installed
        err = refused(str(config), "--sampler.executor", "ray")
    assert err == "palaestra: error: sampler.executor ray needs Ray: pip install 'palaestra[ray]'\n"


# -- Ray: last in the module, whose cluster stays up until its end -------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A local Ray cluster of 2 CPUs on loopback for these tests (starting one takes seconds), whose
    workers load the toy environment by name (``toy_rl_env.install``)."""
    ray = pytest.importorskip("ray")
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    runtime_env = {"env_vars": {"PYTHONPATH": path}, "worker_process_setup_hook": "toy_rl_env.install"}
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        runtime_env=runtime_env,
    )
    yield ray
    ray.shutdown()


def on_ray_workers(config: Path, address: str) -> list[str]:
    """``train rl CONFIG`` with its groups rolled out by 2 workers of the cluster at ``address``."""
    return ["train", "rl", str(config), "--sampler.executor", f"ray={address}", "--sampler.workers", "2"]


def test_ray_workers_roll_out_the_one_process_batches_even_when_one_is_killed_mid_step(
    cluster: Any,
    tiny_model_dir: Path,
    tmp_path: Path,
    one_process: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from palaestra.eval.ray_executor import RayExecutor

    executors: list[RayExecutor] = []
    real = RayExecutor.stream_groups

    async def kill_after_the_first_group(self: RayExecutor, *args: Any) -> AsyncGenerator[Any, None]:
        async with contextlib.aclosing(real(self, *args)) as groups:
            async for group in groups:
                if not executors:  # step 1's first group is back: the first worker still has others
                    executors.append(self)
                    cluster.kill(self.live[0])
                yield group

    monkeypatch.setattr(RayExecutor, "stream_groups", kill_after_the_first_group)
    port = free_port()
    config = toy_config(tmp_path / "rl.toml", tiny_model_dir, tmp_path / "run", served(port))
    address = cluster.get_runtime_context().gcs_address  # the running cluster's: checked, then joined
    code = main([*on_ray_workers(config, address), "--quiet"])
    assert code == 0, capsys.readouterr().err
    (executor,) = executors
    assert executor.stats.died == 1 and executor.stats.rerun >= 1 and executor.stats.started == 3
    assert not executor.live  # stopped with the run (the cluster is this test's)
    assert_same_run(tmp_path / "run", one_process)  # nothing lost, nothing twice, the same rollouts


def test_every_ray_worker_gone_stops_the_run_in_one_line_before_it_trains(
    cluster: Any,
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from palaestra.eval.ray_executor import RayExecutor

    real = RayExecutor.stream_groups

    async def kill_every_worker(self: RayExecutor, *args: Any) -> AsyncGenerator[Any, None]:
        async with contextlib.aclosing(real(self, *args)) as groups:
            async for group in groups:
                for worker in self.live:  # the one worker, then its one replacement
                    cluster.kill(worker)
                yield group

    monkeypatch.setattr(RayExecutor, "stream_groups", kill_every_worker)
    port, run = free_port(), tmp_path / "run"
    config = toy_config(tmp_path / "rl.toml", tiny_model_dir, run, served(port))
    code = main(
        ["train", "rl", str(config), "--sampler.executor", "ray", "--sampler.workers", "1", "--quiet"]
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("palaestra: error:")]
    assert code == 1 and len(errors) == 1, errors
    said = "every rollout worker died (2), with no replacement left; the run stopped, with no step trained"
    assert said in errors[0]
    stopped = int(errors[0].split("step ")[1].split(":")[0])  # 1, or 2 when step 1's groups were all back
    assert [r["step"] for r in records(run)] == list(range(stopped))  # the held-out games, then no step


def test_two_ranks_take_the_one_process_steps_from_rank_0s_ray_workers(
    cluster: Any, tiny_model_dir: Path, tmp_path: Path, one_process: Path
) -> None:
    """Under torchrun, rank 0 drives the Ray workers for every group of the step and the ranks'
    exchange gives the other rank the whole batch: the one-process run's steps again."""
    port = free_port()
    config = toy_config(tmp_path / "rl.toml", tiny_model_dir, tmp_path / "run", served(port))
    address = cluster.get_runtime_context().gcs_address
    done = subprocess.run(
        [*RANKS, *on_ray_workers(config, address)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TOY_RAY_ADDRESS": address},
    )
    assert done.returncode == 0, done.stderr
    assert "rollouts on 2 Ray workers" in done.stdout  # rank 0 said it: the workers rolled out
    assert_same_run(tmp_path / "run", one_process)  # every group once: had rank 0 sampled a share, half
