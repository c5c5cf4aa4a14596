"""Data-parallel training on 2 processes (torchrun, gloo on the CPU) takes the very step one process
takes: SFT end to end through ``palaestra train sft --nproc 2``, every RL loss on a fixed batch;
only rank 0 writes; a checkpoint loads at any world size; bad input is one line, exit 2, nothing
written. Tiny models, one thread per process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.cli import main

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
tictactoe = pytest.importorskip("tictactoe")

from distributed_rl import CASES, run_case  # noqa: E402 - after the skips: it imports torch

from palaestra.train import sft  # noqa: E402
from palaestra.train.distributed import World  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def one_thread(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each process on one thread (the ranks are separate processes: they inherit the variable)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def assert_same_weights(a: dict[str, Any], b: dict[str, Any], atol: float) -> None:
    assert a.keys() == b.keys()
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst <= atol, f"weights differ by up to {worst}"


def assert_same_adam_steps(a: dict[str, Any], b: dict[str, Any]) -> None:
    """The weights after the same AdamW steps at lr 1e-2 whose gradients were summed in another order:
    all but 0.1% of them within 1e-5 and every one within 1e-3 (a tenth of a step). AdamW moves a
    weight by about lr whatever the size of its gradient, so a weight whose gradient is near AdamW's
    eps (1e-8) turns the last bits of the sums into a visible difference (measured on 2 ranks: 6 of
    116,160 weights, up to 1.3e-4); a step on other gradients moves most weights differently."""
    assert a.keys() == b.keys()
    diffs = [(a[k].float() - b[k].float()).abs().flatten() for k in a]
    total, loose = sum(d.numel() for d in diffs), sum(int((d > 1e-5).sum()) for d in diffs)
    worst = max(float(d.max()) for d in diffs)
    assert loose <= total / 1000, f"{loose} of {total} weights differ by more than 1e-5 (up to {worst})"
    assert worst <= 1e-3, f"weights differ by up to {worst}"


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def sft_config(tmp_path: Path, model_dir: Path) -> Path:
    rows = []
    for i in range(8):
        reply = " ".join(
            ["the cat sat on the mat", "a red bird flew over the tree"][i % 2].split()[: 3 + i % 4]
        )
        rows.append(
            {"messages": [{"role": "user", "content": f"say {i}"}, {"role": "assistant", "content": reply}]}
        )
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "sft.toml"
    path.write_text(f"""
[model]
path = "{model_dir}"
[data]
path = "{tmp_path / "chats.jsonl"}"
max_length = 48
[optim]
lr = 1e-2
[train]
steps = 3
batch_size = 4
micro_batch_tokens = 48
threads = 1
[output]
dir = "{tmp_path / "run"}"
save_every = 1
""")
    return path


@pytest.mark.slow
def test_sft_steps_at_2_processes_are_the_one_process_steps_and_checkpoints_load_at_any_size(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = sft_config(tmp_path, tiny_model_dir)
    run = tmp_path / "run"  # the one-process run: 3 steps, a checkpoint after each
    assert main(["train", "sft", str(config), "--quiet"]) == 0
    # a copy of it at step 1, whose step 2 is taken on 2 processes: an N=1 checkpoint loads at N=2
    split = tmp_path / "split"
    shutil.copytree(run, split, symlinks=True)
    for step in (2, 3):
        shutil.rmtree(split / "checkpoints" / f"step-00000{step}")
    capsys.readouterr()
    code = main(["train", "sft", "--resume", str(split), "--train.steps", "2", "--nproc", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert_same_adam_steps(
        weights(split / "checkpoints" / "step-000002"), weights(run / "checkpoints" / "step-000002")
    )
    one, two = metrics(run), metrics(split)
    assert [r["step"] for r in two] == [1, 2]  # rank 0 alone wrote the log: no step twice
    for key in ("loss", "grad_norm", "trained_tokens", "tokens"):
        assert two[1][key] == pytest.approx(one[1][key], rel=1e-5), key
    # and the checkpoint saved at N=2 resumes at N=1, to the one-process run's step 3
    assert main(["train", "sft", "--resume", str(split), "--train.steps", "3", "--quiet"]) == 0
    assert_same_adam_steps(weights(split / "final"), weights(run / "final"))
    assert (split / "final").resolve().name == "step-000003"


def test_a_bad_row_in_another_ranks_share_is_one_line_from_rank_0_and_writes_nothing(
    tiny_model_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = sft_config(tmp_path, tiny_model_dir)
    data = tmp_path / "chats.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[6]["messages"][0]["content"] = "say " + "the cat sat " * 40  # row 6: in rank 1's share of 8
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["train", "sft", str(config), "--nproc", "2", "--quiet"]) == 2
    err = capfd.readouterr().err
    assert err.count("palaestra: error:") == 1, err
    assert "data.max_length 48 is shorter than the prompt of row 6" in err
    assert not (tmp_path / "run").exists()


def test_a_rank_of_torchruns_ends_with_its_own_status_and_its_last_words(tmp_path: Path) -> None:
    """A rank leaves without the interpreter's teardown (where gloo's threads could abort it after a
    refusal and turn exit 2 into SIGABRT); its status and its error line still come out."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as by default
    env |= {"TORCHELASTIC_RUN_ID": "test", "RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "palaestra", "train", "sft", str(tmp_path / "missing.toml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("palaestra: error:") and "missing.toml" in done.stderr, done.stderr
    listed = subprocess.run(  # stdout to a pipe is block-buffered: it must be flushed before the end
        [sys.executable, "-m", "palaestra", "envs"], env=env, capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0 and "tictactoe\t" in listed.stdout, listed.stderr


@pytest.fixture(scope="module")
def two_ranks(
    tiny_model_dir: Path, tiny_tictactoe_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """One torchrun launch of 2 ranks (``distributed_rl.py``): every loss's update, then an RL run."""
    out = tmp_path_factory.mktemp("two-ranks")
    config = out / "rl.toml"
    config.write_text(f"""
[model]
path = "{tiny_tictactoe_model_dir}"
[env]
id = "tictactoe"
args = {{num_examples = 8}}
[sampling]
max_tokens = 6
[train]
steps = 1
batch_size = 8
rollouts_per_example = 2
threads = 1
[eval]
num_examples = 2
sets = [{{name = "held-out", args = {{num_examples = 2, seed = 100}}}}]
[output]
dir = "{out / "run"}"
sample_every = 1
sample_groups = 4
""")
    launch_rl_ranks(tiny_model_dir, out, config)
    return out


def launch_rl_ranks(
    model_dir: Path, out: Path, config: Path, *args: str, pythonpath: str = "", nproc: int = 2
) -> None:
    """``distributed_rl.py MODEL_DIR OUT CONFIG ARGS...`` on ``nproc`` torchrun ranks, one thread each."""
    environ = {**os.environ, "OMP_NUM_THREADS": "1"} | ({"PYTHONPATH": pythonpath} if pythonpath else {})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    script = [str(HERE / "distributed_rl.py"), str(model_dir), str(out), str(config), *args]
    subprocess.run([*command, *script], check=True, env=environ, timeout=300)


@pytest.mark.slow
def test_each_rl_loss_at_2_processes_takes_the_one_process_update(
    tiny_model_dir: Path, two_ranks: Path
) -> None:
    for case in CASES:
        assert_ranks_took_the_one_process_update(tiny_model_dir, two_ranks, case)


@pytest.mark.slow
def test_each_rl_loss_at_3_processes_takes_the_one_process_update(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """More than 2 ranks: the 7 rollouts are dealt 3, 2 and 2 (one rollout: two ranks train nothing
    and still take part in the sums)."""
    launch_rl_ranks(tiny_model_dir, tmp_path, Path("-"), nproc=3)
    for case in CASES:
        assert_ranks_took_the_one_process_update(tiny_model_dir, tmp_path, case)


def assert_ranks_took_the_one_process_update(model_dir: Path, ranks_dir: Path, case: Any) -> None:
    """The update of ``case`` (``distributed_rl.py``'s) that the ranks saved in ``ranks_dir`` is the
    one process's: the weights to 1e-5 (lr 1e-3), the token count exactly, the statistics to rel 1e-5."""
    alone, stats = run_case(model_dir, case, World())
    assert_same_weights(torch.load(ranks_dir / f"{case[0]}.pt"), alone, atol=1e-5)
    two = json.loads((ranks_dir / f"{case[0]}.json").read_text())
    assert two["trained_tokens"] == stats.trained_tokens
    for key in ("loss", "grad_norm", "entropy", "ratio_mean", "clipped_fraction"):
        assert two[key] == pytest.approx(getattr(stats, key), rel=1e-5, abs=1e-7), (case[0], key)
    if case[2]:
        assert two["kl"] == pytest.approx(stats.kl, rel=1e-5, abs=1e-9)


@pytest.mark.slow
def test_an_rl_run_on_2_processes_writes_once_evaluates_on_rank_0_and_resumes_on_1(two_ranks: Path) -> None:
    run = two_ranks / "run"
    records = metrics(run)
    assert [r["step"] for r in records] == [0, 1]  # one log, one held-out evaluation before training
    assert records[1]["groups"] == 4 and "eval/held-out/reward" in records[0]  # every rank's groups
    sample = pa.load_run(run / "samples" / "step-000001")  # the whole batch: both ranks' rollouts
    assert sorted({r.example_id for r in sample.rollouts}) == [0, 1, 2, 3] and len(sample.rollouts) == 8
    assert len(pa.load_run(run / "evals" / "step-000001" / "held-out").rollouts) == 2
    # saved on 2 processes, it goes on in one
    assert main(["train", "rl", "--resume", str(run), "--train.steps", "2", "--quiet"]) == 0
    assert [r["step"] for r in metrics(run)] == [0, 1, 2]
    assert (run / "final").resolve().name == "step-000002"


def test_a_world_size_that_does_not_divide_the_batch_is_one_line_and_writes_nothing(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = sft_config(tmp_path, tiny_model_dir)
    assert main(["train", "sft", str(config), "--nproc", "3"]) == 2  # checked before any process starts
    err = capsys.readouterr().err
    assert err.strip() == (
        "palaestra: error: train.batch_size (4) is not divisible by the world size (3 processes): "
        "use a multiple of 3, or another number of processes"
    )
    # under torchrun itself (its variables set), each rank refuses before joining the others
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    assert main(["train", "sft", str(config)]) == 2
    assert "is not divisible by the world size (3 processes)" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "1")  # another rank: the same refusal, and only rank 0 says it
    assert main(["train", "sft", str(config)]) == 2
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "run").exists()
    rl = tmp_path / "rl.toml"  # RL: the groups of a step are shared, never split
    rl.write_text(
        f'[model]\npath = "{tiny_model_dir}"\n[env]\nid = "tictactoe"\n[train]\nbatch_size = 12\n'
        f'rollouts_per_example = 4\n[output]\ndir = "{tmp_path / "rl"}"\n'
    )
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "rl", str(rl)]) == 2
    assert (
        "the groups of a step (train.batch_size / train.rollouts_per_example) (3) is not divisible by "
        "the world size (2 processes)" in capsys.readouterr().err
    )
    assert not (tmp_path / "rl").exists()


def test_a_checkpoint_of_another_model_is_refused_in_one_line_and_kept(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = sft_config(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    assert main(["train", "sft", str(config), "--train.steps", "1", "--quiet"]) == 0
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    # the saved optimizer state is of the full model; a LoRA run cannot continue from it
    code = main(["train", "sft", "--resume", str(run), "--train.steps", "2", "--lora.enabled", "true"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "checkpoint" in err, err
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before
    assert sft.resume_config(run).lora.enabled is False  # config.toml kept as it was
