"""FSDP2 (``train.fsdp``) on 2 processes (torchrun, gloo on the CPU) takes the very step one process
takes: SFT end to end through ``palaestra train sft --nproc 2``, the default RL loss (and a batch
that leaves a rank nothing) on a fixed batch, and an RL run with the local sampler; its checkpoints
are full state, resumed at 1 process and from a 1-process one; LoRA with it is refused in one line.
The same for the layer-by-layer mode (``train.fsdp = "layers"``), whose ranks run as many passes
(a rank with fewer conversations or rollouts pads), and which refuses a shared prefix in one line.
In both modes an RL run with a remote sampler (``palaestra serve``) sends it the whole weights at
every sync. Tiny models, one thread per process."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from palaestra.cli import main
from palaestra.testing.train_smoke import rl_toml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from distributed_rl import FSDP_CASES  # noqa: E402 - after the skips: it imports torch
from test_train_distributed import (  # noqa: E402
    assert_ranks_took_the_one_process_update,
    assert_same_adam_steps,
    launch_rl_ranks,
    metrics,
    sft_config,
    weights,
)
from test_train_rl import length_env_site  # noqa: E402
from test_train_rl_remote import PROMPT, SEEDED, free_port, model_logprobs, serve_command  # noqa: E402

SHARDED = "(FSDP: optimizer state sharded)"  # the run line of a sharded run
LAYERED = "(FSDP: weights sharded, gathered layer by layer)"  # of one in the layer mode


@pytest.fixture(autouse=True)
def one_thread(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each process on one thread (the ranks are separate processes: they inherit the variable)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rl_config(path: Path, model_dir: Path, run_dir: Path, *, steps: int, fsdp: bool | str) -> Path:
    """RL on ``length_toy`` (rewards that differ within a group: every step trains), one request at
    a time (the same rows, so the same floats, at any world size), a checkpoint every step, held-out
    games at the start and the end; the layer mode without a shared prefix (it refuses one)."""
    mode = '"layers"\nshare_prefix = false' if fsdp == "layers" else str(fsdp).lower()
    return rl_toml(
        path,
        model_dir,
        run_dir,
        "length_toy",
        max_tokens=8,
        steps=steps,
        batch_size=8,
        rollouts_per_example=4,
        lr=1e-2,
        train=f"max_concurrent = 1\nfsdp = {mode}",
        eval='num_examples = 2\nsets = [{name = "held", args = {}}]',  # rank 0 plays them alone
        output="save_every = 1\nsample_every = 0",
    )


@pytest.fixture(scope="module", params=["fsdp", "layers"])
def sharded_ranks(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Path:
    """One torchrun launch of 2 sharded ranks (``distributed_rl.py ... fsdp``, or ``layers``): the
    FSDP cases' updates, then 2 steps of an RL run with ``train.fsdp`` and the local sampler."""
    out = tmp_path_factory.mktemp(f"{request.param}-ranks")
    site = length_env_site(out)
    mode = True if request.param == "fsdp" else "layers"
    config = rl_config(out / "rl.toml", tiny_model_dir, out / "run", steps=2, fsdp=mode)
    pythonpath = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    launch_rl_ranks(tiny_model_dir, out, config, request.param, pythonpath=pythonpath)
    return out


@pytest.mark.slow
def test_the_default_rl_loss_sharded_on_2_processes_takes_the_one_process_update(
    tiny_model_dir: Path, sharded_ranks: Path
) -> None:
    for case in FSDP_CASES:
        assert_ranks_took_the_one_process_update(tiny_model_dir, sharded_ranks, case)


@pytest.mark.slow
def test_a_sharded_rl_run_samples_locally_takes_the_one_process_steps_and_resumes_on_1(
    tiny_model_dir: Path, sharded_ranks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(sharded_ranks / "site"))  # length_toy, in this process too
    alone = tmp_path / "alone"
    assert (
        main(
            [
                "train",
                "rl",
                str(rl_config(tmp_path / "rl.toml", tiny_model_dir, alone, steps=3, fsdp=False)),
                "--quiet",
            ]
        )
        == 0
    )
    run = sharded_ranks / "run"
    one, two = metrics(alone), metrics(run)
    assert [r["step"] for r in two] == [0, 1, 2]  # rank 0 alone wrote the log; step 0: held-out games
    held = "eval/held/reward"  # played by rank 0 alone, the other rank waiting: no collective among them
    assert two[0][held] == pytest.approx(one[0][held]) and two[2][held] >= 0
    for mine, theirs in zip(two[1:], one[1:], strict=False):
        assert mine["zero_groups"] < mine["groups"]  # a step that trained
        for key in ("reward", "loss", "grad_norm", "trained_tokens"):  # the loss sums terms of both signs
            assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-6), key
    for step in (1, 2):
        name = f"step-{step:06d}"
        assert_same_adam_steps(weights(run / "checkpoints" / name), weights(alone / "checkpoints" / name))
    # its full-state checkpoint (weights and AdamW's moments) goes on in one process, to step 3
    assert main(["train", "rl", "--resume", str(run), "--train.steps", "3", "--quiet"]) == 0
    assert_same_adam_steps(weights(run / "final"), weights(alone / "final"))
    assert metrics(run)[3]["grad_norm"] == pytest.approx(metrics(alone)[3]["grad_norm"], rel=1e-5)
    assert metrics(run)[3][held] == pytest.approx(metrics(alone)[3][held])  # the final weights' games


@pytest.mark.slow
def test_sharded_sft_on_2_processes_takes_the_one_process_step_and_resumes_across_world_sizes(
    tiny_model_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = sft_config(tmp_path, tiny_model_dir)
    data = tmp_path / "chats.jsonl"  # a system prompt every row starts with: the shared prefix runs once
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    system = {"role": "system", "content": "the cat sat on the mat and a red bird flew over the tree"}
    data.write_text("".join(json.dumps({"messages": [system, *r["messages"]]}) + "\n" for r in rows))
    run = tmp_path / "run"  # the one-process run: 3 steps, a checkpoint after each
    longer = ["--data.max_length", "96", "--train.micro_batch_tokens", "96"]
    assert main(["train", "sft", str(config), *longer, "--quiet"]) == 0
    assert all(r["shared_prefix"] > 0 for r in metrics(run))
    # a copy at step 1 takes step 2 sharded on 2 processes, from the one-process checkpoint
    split = tmp_path / "split"
    shutil.copytree(run, split, symlinks=True)
    for step in (2, 3):
        shutil.rmtree(split / "checkpoints" / f"step-00000{step}")
    capfd.readouterr()
    code = main(
        ["train", "sft", "--resume", str(split), "--train.steps", "2", "--train.fsdp", "true", "--nproc", "2"]
    )
    out, err = capfd.readouterr()
    assert code == 0, err
    assert SHARDED in out  # the ranks did shard
    name = "step-000002"
    assert_same_adam_steps(weights(split / "checkpoints" / name), weights(run / "checkpoints" / name))
    one, two = metrics(run), metrics(split)
    assert [r["step"] for r in two] == [1, 2]
    for key in ("loss", "grad_norm", "trained_tokens", "tokens"):  # a mean of the gradients: grad_norm halves
        assert two[1][key] == pytest.approx(one[1][key], rel=1e-5), key
    # its full-state checkpoint goes on in one process (train.fsdp, saved in its config, is off there)
    assert main(["train", "sft", "--resume", str(split), "--train.steps", "3"]) == 0
    assert "train.fsdp: off in one process" in capfd.readouterr().out
    assert_same_adam_steps(weights(split / "final"), weights(run / "final"))
    assert metrics(split)[2]["grad_norm"] == pytest.approx(one[2]["grad_norm"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_layered_sft_on_2_processes_pads_the_rank_with_fewer_passes_and_takes_the_one_process_steps(
    checkpointing: bool, tiny_model_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = sft_config(tmp_path, tiny_model_dir)
    data = tmp_path / "chats.jsonl"  # 5 conversations, 4 a step: step 2 has one, rank 0 none (it pads)
    data.write_text("".join(line + "\n" for line in data.read_text().splitlines()[:5]))
    run = tmp_path / "run"  # the one-process run: 4 steps, a checkpoint after each
    assert main(["train", "sft", str(config), "--train.steps", "4", "--quiet"]) == 0
    # a copy at step 1 takes steps 2 and 3 layer by layer on 2 processes, from the one-process checkpoint
    split = tmp_path / "split"
    shutil.copytree(run, split, symlinks=True)
    for step in (2, 3, 4):
        shutil.rmtree(split / "checkpoints" / f"step-00000{step}")
    layered = ["--train.fsdp", "layers", "--train.share_prefix", "false"]
    layered += ["--train.gradient_checkpointing", "true"] if checkpointing else []  # layers recomputed
    capfd.readouterr()
    code = main(["train", "sft", "--resume", str(split), "--train.steps", "3", *layered, "--nproc", "2"])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert LAYERED in out  # the ranks did shard, layer by layer
    one, two = metrics(run), metrics(split)
    assert [r["step"] for r in two] == [1, 2, 3] and two[1]["trained_tokens"] < two[2]["trained_tokens"]
    for step in (2, 3):
        name = f"step-00000{step}"
        assert_same_adam_steps(weights(split / "checkpoints" / name), weights(run / "checkpoints" / name))
        for key in ("loss", "grad_norm", "trained_tokens"):  # the ranks' gradients averaged: grad_norm halves
            assert two[step - 1][key] == pytest.approx(one[step - 1][key], rel=1e-5), (step, key)
    # its full-state checkpoint goes on in one process
    assert main(["train", "sft", "--resume", str(split), "--train.steps", "4", "--quiet"]) == 0
    assert_same_adam_steps(weights(split / "final"), weights(run / "final"))
    assert metrics(split)[3]["grad_norm"] == pytest.approx(one[3]["grad_norm"], rel=1e-5)


REFUSED = {
    "layers with a shared prefix": (
        ["--train.fsdp", "layers"],
        'train.fsdp = "layers" needs train.share_prefix = false',
    ),
    "lora": (
        ["--train.fsdp", "true", "--lora.enabled", "true"],
        "train.fsdp with lora.enabled is not supported",
    ),
}


@pytest.mark.parametrize("refused", list(REFUSED))
@pytest.mark.parametrize("trainer", ["sft", "rl"])
def test_what_fsdp_refuses_is_one_line_and_writes_nothing(
    trainer: str, refused: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The layer mode with a shared prefix (on by default: its late backward reaches resharded
    layers), and LoRA with either mode."""
    args, message = REFUSED[refused]
    if trainer == "sft":
        config = sft_config(tmp_path, tiny_model_dir)
    else:
        config = rl_config(tmp_path / "rl.toml", tiny_model_dir, tmp_path / "run", steps=1, fsdp=False)
    code = main(["train", trainer, str(config), *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "run").exists()


def remote_sampler(url: str, weights_dir: Path) -> list[str]:
    """The overrides of a remote sampler at ``url`` that palaestra does not start, serving ``weights_dir``."""
    return ["--sampler.kind", "vllm", "--sampler.url", url, "--sampler.weights_dir", str(weights_dir)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [True, "layers"], ids=["fsdp-tied", "layers"])
async def test_a_sharded_run_sends_a_remote_sampler_the_whole_weights_at_every_sync(
    mode: bool | str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """2 sharded ranks sampling from one ``palaestra serve`` the run does not start (it is still up
    after the run): every step samples the weights the trainer has (no mismatch), and at the end
    the folder it serves holds the final checkpoint's weights and its logprobs of a seeded reply
    are the final model's, not the starting one's. ``true`` on a model whose output layer is tied
    (written untied, from the gathered weights), the layer mode on an untied one."""
    from conftest import tiny_sentences
    from transformers import AutoModelForCausalLM

    from palaestra.clients.openai import OpenAIClient
    from palaestra.tiny_model import TinyConfig, build_tiny_model
    from palaestra.train.samplers.server import ServerProcess

    start = tiny_model_dir
    if mode is True:
        start = tmp_path / "tied"
        build_tiny_model(tiny_sentences(), TinyConfig(tie_embeddings=True), path=start)
    served, run = tmp_path / "served", tmp_path / "run"
    shutil.copytree(start, served)  # the folder the server serves: the run overwrites its weights
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    server = ServerProcess(serve_command(port).replace("{weights_dir}", str(served)), tmp_path / "serve.log")
    await server.start(url, timeout=120)
    try:
        config = rl_config(tmp_path / "rl.toml", start, run, steps=2, fsdp=mode)
        site = length_env_site(tmp_path)
        pythonpath = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
        argv = ["train", "rl", str(config), *remote_sampler(url, served), "--nproc", "2", "--quiet"]
        environ = {**os.environ, "PYTHONPATH": pythonpath}
        command = [sys.executable, "-m", "palaestra", *argv]
        done = await asyncio.to_thread(
            subprocess.run, command, capture_output=True, text=True, env=environ, timeout=300
        )
        assert done.returncode == 0, done.stderr
        assert (SHARDED if mode is True else LAYERED) in done.stdout and "sampler vllm" in done.stdout
        steps = metrics(run)[1:]
        assert [r["step"] for r in steps] == [1, 2] and all(r["zero_groups"] < r["groups"] for r in steps)
        for record in steps:  # sampled by the weights pushed before the step: the trainer's, to float noise
            assert abs(record["mismatch/log_ratio_max"]) < 1e-4, record
        final, pushed = weights(run / "final"), weights(served)  # the last push: before the final games
        assert final.keys() <= pushed.keys() and all(torch.equal(pushed[k], final[k]) for k in final)
        if mode is True:  # written untied: the output layer a weight of its own, the embedding's values
            assert json.loads((served / "config.json").read_text())["tie_word_embeddings"] is False
            assert torch.equal(pushed["lm_head.weight"], pushed["model.embed_tokens.weight"])
        client = OpenAIClient(str(served), base_url=url, extra_body={"return_token_ids": True})
        try:
            reply = await client.chat(PROMPT, sampling=SEEDED)
        finally:
            await client.aclose()
    finally:
        await server.stop()
    theirs = torch.tensor(reply.logprobs)
    trained = AutoModelForCausalLM.from_pretrained(run / "final", dtype=torch.float32).eval()
    first = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32).eval()
    assert torch.allclose(model_logprobs(trained, reply), theirs, atol=1e-4)
    assert not torch.allclose(model_logprobs(first, reply), theirs, atol=1e-3)  # the run moved them


def test_fsdp_with_a_remote_sampler_is_not_refused_an_unreachable_server_is_one_line(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(length_env_site(tmp_path)))  # length_toy, in this process
    config = rl_config(tmp_path / "rl.toml", tiny_model_dir, tmp_path / "run", steps=1, fsdp=True)
    code = main(["train", "rl", str(config), *remote_sampler("http://127.0.0.1:9/v1", tmp_path / "w")])
    err = capsys.readouterr().err  # the server is reached after the model loads: its bar comes first
    errors = [line for line in err.splitlines() if line.startswith("palaestra: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "sampler.url: cannot reach the sampler server at http://127.0.0.1:9/v1" in errors[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "w").exists()
