"""long_context_qa with a local model: the RLM solver's rollouts as SFT data (the root model's turns
only), a few SFT steps of a tiny model, that model played through ``LocalClient`` (its own sub-model
too), then a few RL steps on the environment."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import long_context_qa as lc
import pytest

import palaestra as pa
from palaestra.cli import main
from palaestra.data.rollouts import save_dataset
from palaestra.repl import live_workers
from palaestra.testing.repl import sandbox_problem, sandbox_processes

pytest.importorskip("torch")
pytest.importorskip("transformers")
PROBLEM = sandbox_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"no bubblewrap sandbox here: {PROBLEM}")

SFT = """
[data]
path = "{data}"
max_length = 2048

[model.tiny]
vocab_size = 600
hidden_size = 32
intermediate_size = 64
num_layers = 1
num_heads = 2
num_kv_heads = 1
max_positions = 2048

[optim]
lr = 1e-2

[train]
steps = 3
batch_size = 4
micro_batch_tokens = 8192
threads = 1

[output]
dir = "{run}"
"""

RL = """
[model]
path = "{model}"

[env]
id = "long_context_qa"
args = {{num_examples = 4, records = 200, limits = {{call_seconds = 5.0}}}}

[sampling]
max_tokens = 16

[train]
steps = 2
batch_size = 4
rollouts_per_example = 2
threads = 1

[eval]
num_examples = 2

[output]
dir = "{run}"
"""


def test_sft_then_local_client_then_rl_on_a_tiny_rlm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taught = asyncio.run(
        lc.load_environment(num_examples=12, records=200).run(pa.ScriptedClient(lc.rlm_solver))
    )
    assert all(r.reward == 1.0 and r.tools for r in taught)
    assert all("Record 00150" not in json.dumps(r.messages) for r in taught)  # the sub-calls read it, not SFT
    save_dataset(taught, tmp_path / "solver")
    (tmp_path / "sft.toml").write_text(SFT.format(data=tmp_path / "solver", run=tmp_path / "sft"))
    assert main(["train", "sft", str(tmp_path / "sft.toml"), "--quiet"]) == 0, capsys.readouterr().err
    model = tmp_path / "sft" / "final"

    async def play() -> list[pa.Rollout]:
        client = pa.LocalClient(str(model), device="cpu")
        try:
            env = lc.load_environment(num_examples=2, records=200, limits={"call_seconds": 5.0})
            return await env.run(client, pa.RunSpec(sampling=pa.Sampling(temperature=0, max_tokens=16)))
        finally:
            await client.aclose()

    played = asyncio.run(play())
    assert len(played) == 2 and all(r.error is None and r.reward is not None for r in played)
    assert all(r.turns[0].prompt_token_ids and r.tools for r in played)  # the tools were in its prompt

    (tmp_path / "rl.toml").write_text(RL.format(model=model, run=tmp_path / "rl"))
    code = main(["train", "rl", str(tmp_path / "rl.toml"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0]  # (a random tiny model earns no reward: no signal yet)
    assert [r["step"] for r in steps] == [1, 2] and all(r["groups"] == 2 and r["errors"] == 0 for r in steps)
    assert all(r["metrics/exact_answer"] == r["reward"] for r in steps)  # scored by the FINAL answer
    assert live_workers() == 0 and not sandbox_processes()
