"""``palaestra train rl`` end to end on a tiny model: the run folder, resume, the held-out sets, the
saved samples, and one clear error (exit 2 before any work, exit 1 mid-run) for each kind of bad
input. The environment is a one-turn toy whose reward a random model's replies already spread
(the share of ``a`` in the reply), so every step has a learning signal."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.cli import main
from palaestra.registry import EnvironmentArgsError
from palaestra.train import checkpoint as ckpt

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def share_of_a(completion: list[dict[str, Any]]) -> float:
    text = str(completion[-1]["content"])
    return text.count("a") / max(len(text), 1)


def toy_env(num_examples: int = 8, seed: int = 0) -> pa.Environment:
    if num_examples < 1:
        raise ValueError(f"num_examples must be at least 1, got {num_examples}")
    rows = [{"question": f"say something {i + seed}"} for i in range(num_examples)]
    return pa.SingleTurnEnv(dataset=rows, rubric=pa.Rubric([share_of_a]))


@pytest.fixture(autouse=True)
def toy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``env.id = "toy"`` loads the toy environment; other ids load as usual."""
    from palaestra.train import rl_rollouts

    real = rl_rollouts.load_environment

    def load(name: str, **kwargs: Any) -> pa.Environment:
        if name != "toy":
            return real(name, **kwargs)
        unknown = sorted(set(kwargs) - {"num_examples", "seed"})
        if unknown:  # as the registry says it of an installed environment
            raise EnvironmentArgsError(f"environment 'toy' does not take {unknown}")
        return toy_env(**kwargs)

    monkeypatch.setattr(rl_rollouts, "load_environment", load)


@pytest.fixture
def config(tmp_path: Path, tiny_model_dir: Path) -> Path:
    path = tmp_path / "rl.toml"
    path.write_text(f"""
[model]
path = "{tiny_model_dir}"

[env]
id = "toy"
args = {{num_examples = 8}}

[sampling]
max_tokens = 8

[optim]
lr = 1e-3

[train]
steps = 2
batch_size = 8
rollouts_per_example = 4
threads = 1

[eval]
num_examples = 4
sets = [{{name = "held-out", args = {{num_examples = 4, seed = 100}}}}]

[output]
dir = "{tmp_path / "run"}"
save_every = 1
sample_every = 1
sample_groups = 1
""")
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_logs_evaluates_samples_checkpoints_and_resumes(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    code, out, err = run_cli(capsys, "train", "rl", config, "--quiet")
    assert code == 0, err
    assert "env: toy, 8 examples, 2 groups of 4 per step" in out and "step 2/2" in err
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]  # step 0: the held-out sets before training
    assert "eval/held-out/reward" in records[0] and "eval/held-out/reward" in records[2]
    for record in records[1:]:
        assert 0 <= record["reward"] <= 1 and record["groups"] == 2 and record["errors"] == 0
        assert math.isfinite(record["loss"]) and record["trained_tokens"] > 0
        assert record["seconds_sampling"] > 0 and record["metrics/share_of_a"] == pytest.approx(
            record["reward"]
        )
    # the batch's sample and the held-out evaluations are saved runs that load
    sample = pa.load_run(run_dir / "samples" / "step-000002")
    assert len(sample.rollouts) == 4 and all(r.turns[0].token_ids for r in sample.rollouts)
    # its header says which policy sampled it, how many groups it holds and when its step ran
    header = sample.metadata
    assert header.model.endswith("@ policy version 1") and header.spec.num_examples == 1
    assert header.started_at and header.finished_at and header.started_at <= header.finished_at
    held_out = pa.load_run(run_dir / "evals" / "step-000002" / "held-out")
    assert len(held_out.rollouts) == 4 and held_out.metadata.env_args == {"num_examples": 4, "seed": 100}
    assert (run_dir / "final").resolve().name == "step-000002" and (run_dir / "curves.html").is_file()
    assert "reward" in (run_dir / "curves.html").read_text()

    code, _, err = run_cli(capsys, "train", "rl", config)
    assert code == 2 and "is not empty: resume it with --resume" in err
    code, _, err = run_cli(capsys, "train", "rl", "--resume", run_dir, "--train.steps", "3", "--quiet")
    assert code == 0, err
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]  # no second step-0 evaluation on resume
    assert (run_dir / "final").resolve().name == "step-000003"
    code, _, err = run_cli(capsys, "train", "rl", "--resume", run_dir, "--quiet")
    assert code == 2 and "at step 3 already" in err


def test_a_lora_run_samples_through_the_adapter(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path
) -> None:
    pytest.importorskip("peft")
    code, _, err = run_cli(
        capsys,
        "train",
        "rl",
        config,
        "--quiet",
        "--lora.enabled",
        "true",
        "--lora.target_modules",
        '["q_proj", "v_proj"]',
        "--train.steps",
        "1",
    )
    assert code == 0, err
    assert (tmp_path / "run" / "final" / "adapter").is_dir()
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[1])
    assert record["trained_tokens"] > 0 and math.isfinite(record["grad_norm"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--train.batch_size", "6"], "batch_size (6) must be a multiple of rollouts_per_example (4)"),
        (["--lora.enabled", "true", "--lora.target_modules", '["qkv"]'], "qkv not in the model; its linear"),
        (["--loss.name", "ppo"], 'loss.name must be one of "grpo", "dr_grpo", "dapo", "cispo", "masked_is"'),
        (["--env.args", "{num_examples = 0}"], "env.args:"),
        (["--env.id", "no-such-env"], "env.args: unknown environment 'no-such-env'"),
        (
            ["--sampling.temperature", "0"],
            "need 0 < temperature < 100 (greedy rollouts of one example are all alike",
        ),
        (["--eval.sets", '[{name = "x", args = {nope = 1}}]'], "eval.sets x: environment 'toy'"),
        (["--model.path", "/no/such/model"], "/no/such/model"),
        (["--train.max_length", "9000"], "micro_batch_tokens (8192) must be at least max_length (9000)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_work(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path, overrides: list[str], message: str
) -> None:
    code, _, err = run_cli(capsys, "train", "rl", config, "--quiet", *overrides)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(lines) == 1 and lines[0].startswith("palaestra: error:") and message in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_chat_template_that_cannot_render_the_prompt_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text("{{ raise_exception('system messages are not supported') }}")
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    code, _, err = run_cli(capsys, "train", "rl", config, "--quiet", "--model.path", model)
    assert code == 2, err
    assert "the model's chat template cannot render the environment's first prompt (user)" in err
    assert "system messages are not supported" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from palaestra.train import policy_update

    real = policy_update.compute_loss
    calls = []

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) > 1:  # the second update goes wrong
            out.loss = out.loss * math.nan
        return out

    monkeypatch.setattr(policy_update, "compute_loss", poisoned)
    code, _, err = run_cli(capsys, "train", "rl", config, "--quiet")
    run_dir = tmp_path / "run"
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("palaestra: error:")]
    assert errors == [
        "palaestra: error: step 2: the loss is nan; stopped before updating the weights; "
        f"the last good checkpoint is {run_dir / 'checkpoints' / 'step-000001'}"
    ]
    assert (run_dir / "checkpoints" / "step-000001").is_dir()
    assert not (run_dir / "checkpoints" / "step-000002").exists() and not (run_dir / "final").exists()
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [
        0,
        1,
    ]


def test_a_batch_whose_every_rollout_failed_stops_the_run_in_one_line(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reward raises on every reply from step 2 on: the run stops there, saying why, and does
    not go on step after step with "no signal"."""
    from palaestra.train import rl_rollouts

    calls = [0]

    def reward(completion: list[dict[str, Any]]) -> float:
        calls[0] += 1
        if calls[0] > 8:  # step 1's batch scores; every later reply raises
            raise RuntimeError("the judge is down")
        return share_of_a(completion)

    def load(name: str, **kwargs: Any) -> pa.Environment:
        rows = [
            {"question": f"say something {i + kwargs.get('seed', 0)}"} for i in range(kwargs["num_examples"])
        ]
        if kwargs.get("seed"):  # the held-out set keeps scoring
            return pa.SingleTurnEnv(dataset=rows, rubric=pa.Rubric([share_of_a]))
        return pa.SingleTurnEnv(dataset=rows, rubric=pa.Rubric([reward]))

    monkeypatch.setattr(rl_rollouts, "load_environment", load)
    code, _, err = run_cli(capsys, "train", "rl", config, "--quiet", "--train.steps", "4")
    run_dir = tmp_path / "run"
    errors = [line for line in err.splitlines() if line.startswith("palaestra: error:")]
    assert code == 1 and len(errors) == 1, err
    assert errors[0].startswith("palaestra: error: step 2: every one of the batch's 8 rollouts failed")
    assert "the judge is down" in errors[0]
    assert errors[0].endswith(f"the last good checkpoint is {run_dir / 'checkpoints' / 'step-000001'}")
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [
        0,
        1,
    ]


def test_a_sampler_that_returns_no_token_ids_is_one_clear_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    from palaestra.train import rl
    from palaestra.train.common import TrainingError
    from palaestra.train.rl_config import EnvConfig, RLConfig, RLOutputConfig, RLTrainConfig
    from palaestra.train.sft_config import ModelConfig

    class NoIds:
        """A sampler whose client answers in text only, as a plain OpenAI endpoint does."""

        def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int) -> None:
            self.client = pa.ScriptedClient(lambda rng: rng.choice(["a banana", "a kiwi"]))

        async def start(self, version: int) -> None:
            pass

        def updating(self) -> Any:
            raise AssertionError("no update may start")

        async def sync(self, version: int) -> None:
            raise AssertionError("no update was made")

        async def failure(self) -> str | None:
            return None

        async def aclose(self) -> None:
            pass

    config = RLConfig(
        model=ModelConfig(path=str(tiny_model_dir)),
        env=EnvConfig(id="toy"),
        train=RLTrainConfig(steps=1, batch_size=8, rollouts_per_example=4),
        output=RLOutputConfig(dir=str(tmp_path / "run")),
    )
    import unittest.mock

    with unittest.mock.patch.object(rl, "LocalSampler", NoIds), pytest.raises(TrainingError) as caught:
        rl.train_rl(config, progress=False)
    assert "step 1: a rollout to train on needs each turn's prompt ids" in str(caught.value)


@pytest.mark.parametrize(
    ("model_dir", "temperature"),
    [("tiny_model_dir", 1.0), ("tiny_model_dir", 0.6), ("sliding_model_dir", 1.0)],
)
async def test_the_trainer_scores_sampled_tokens_as_the_sampler_did(
    model_dir: str, temperature: float, request: pytest.FixtureRequest
) -> None:
    """Unchanged weights: the trainer's logprobs of the sampled tokens equal the sampler's, at any
    temperature, so the loss's ratio is 1 and its correction only acts on real drift; also with
    sliding-window attention, which the sampler's cached batch and the trainer's one pass must
    both apply."""
    import torch

    tiny_model_dir = request.getfixturevalue(model_dir)

    from palaestra.clients.local import LocalClient
    from palaestra.train.model import backbone_and_head
    from palaestra.train.policy_update import _padded, sampled_logprobs
    from palaestra.train.rl_rollouts import collect
    from palaestra.train.rollout_tokens import batch_sequences

    client = LocalClient(str(tiny_model_dir))
    try:
        spec = pa.RunSpec(
            rollouts_per_example=2, sampling=pa.Sampling(temperature=temperature, max_tokens=8, logprobs=True)
        )
        rollouts = await collect(toy_env(4), client, toy_env(4).examples, spec)
        sequences = batch_sequences(rollouts, [1.0] * len(rollouts))
        model = client.hf_model
        inputs = _padded([s.input_ids for s in sequences], 0, torch.long)
        attention = _padded([[1] * len(s.input_ids) for s in sequences], 0, torch.long)
        mask = _padded([s.mask[1:] for s in sequences], False, torch.bool)
        with torch.no_grad():
            chosen, _ = sampled_logprobs(*backbone_and_head(model), inputs, attention, mask, temperature)
        sampler = torch.tensor(
            [lp for s in sequences for lp, m in zip(s.sampler_logprobs[1:], s.mask[1:], strict=True) if m]
        )
        assert len(chosen) == len(sampler) > 0
        assert torch.allclose(chosen, sampler, atol=1e-4)
        with torch.no_grad():  # and scoring at the wrong temperature would not match
            wrong, _ = sampled_logprobs(
                *backbone_and_head(model), inputs, attention, mask, 1.0 if temperature != 1 else 0.5
            )
        assert not torch.allclose(wrong, sampler, atol=1e-2)
    finally:
        await client.aclose()


# --- a run killed mid-step resumes to the very steps and weights of an uninterrupted one -----------

LENGTH_ENV = '''
"""A one-turn toy whose reward is the reply's length: a random model's replies spread it in every group."""
import os
import time
from pathlib import Path

import palaestra as pa

CALLS = [0]


def reply_length(completion):
    CALLS[0] += 1
    if CALLS[0] == int(os.environ.get("LENGTH_TOY_HANG_AT", "0")):  # mid-step: scoring this step's batch
        Path(os.environ["LENGTH_TOY_MARKER"]).write_text(str(CALLS[0]))
        time.sleep(600)
    return len(str(completion[-1]["content"])) / 32


def load_environment(num_examples: int = 8):
    rows = [{"question": f"say something {i}"} for i in range(num_examples)]
    return pa.SingleTurnEnv(dataset=rows, rubric=pa.Rubric([reply_length]))
'''


def length_env_site(root: Path) -> Path:
    """A folder that, on ``PYTHONPATH``, installs the environment ``length_toy`` (an entry point)."""
    site = root / "site"
    (site / "length_toy-0.1.dist-info").mkdir(parents=True)
    (site / "length_toy.py").write_text(LENGTH_ENV)
    (site / "length_toy-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: length-toy\nVersion: 0.1\n"
    )
    (site / "length_toy-0.1.dist-info" / "entry_points.txt").write_text(
        "[palaestra.environments]\nlength_toy = length_toy:load_environment\n"
    )
    return site


def spawn_rl(site: Path, *args: Any, **env: str) -> subprocess.Popen[str]:
    """``palaestra train rl ARGS`` in a process of its own, on one thread, with ``length_toy`` installed."""
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **env}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "palaestra.cli", "train", "rl", *map(str, args), "--quiet"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)


def finished(proc: subprocess.Popen[str]) -> str:
    """The progress lines of a run that ended well."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    return err


def step_figures(run_dir: Path) -> list[dict[str, Any]]:
    """Each step's record without its timings (which differ run to run)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.startswith("seconds") and not k.endswith("_per_s")}
        for r in records
    ]


def test_a_run_sigkilled_mid_step_resumes_to_the_uninterrupted_runs_steps_and_weights(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from safetensors.torch import load_file

    site = length_env_site(tmp_path)
    config = tmp_path / "rl.toml"
    config.write_text(f"""
[model]
path = "{tiny_model_dir}"
[env]
id = "length_toy"
[sampling]
max_tokens = 8
[optim]
lr = 1e-2
[train]
steps = 4
batch_size = 8
rollouts_per_example = 4
max_concurrent = 1  # one request at a time: the same batches of rows, so the same floats, in every run
threads = 1
[output]
save_every = 1
sample_every = 0
""")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    finished(spawn_rl(site, config, "--output.dir", whole))
    figures = step_figures(whole)
    assert [r["step"] for r in figures] == [1, 2, 3, 4]
    assert all(r["zero_groups"] < r["groups"] and r["trained_tokens"] > 0 for r in figures)  # a signal
    weights = [load_file(tiny_model_dir / "model.safetensors")] + [
        load_file(whole / "checkpoints" / f"step-{n:06d}" / "model.safetensors") for n in range(1, 5)
    ]
    for before, after in itertools.pairwise(weights):  # every step moved the weights
        assert any(not torch.equal(before[k], after[k]) for k in before)

    marker = tmp_path / "scoring-step-3"
    proc = spawn_rl(site, config, "--output.dir", cut, LENGTH_TOY_HANG_AT="19", LENGTH_TOY_MARKER=str(marker))
    try:  # 8 rollouts a step: the 19th reward is step 3's third
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert ckpt.latest_checkpoint(cut) == cut / "checkpoints" / "step-000002"
    assert not (cut / "final").exists() and step_figures(cut) == figures[:2]

    progress = finished(spawn_rl(site, "--resume", cut))
    assert "step 1/4" not in progress and "step 2/4" not in progress and "step 3/4" in progress  # from step 2
    assert step_figures(cut) == figures  # steps 3 and 4 exactly as the uninterrupted run took them
    a, b = (load_file(run / "final" / "model.safetensors") for run in (whole, cut))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
