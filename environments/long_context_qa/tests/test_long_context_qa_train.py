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
from palaestra.testing.train_smoke import rl_toml, sft_toml

pytest.importorskip("torch")
pytest.importorskip("transformers")
PROBLEM = sandbox_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"no bubblewrap sandbox here: {PROBLEM}")


def test_sft_then_local_client_then_rl_on_a_tiny_rlm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taught = asyncio.run(
        lc.load_environment(num_examples=12, records=200).run(pa.ScriptedClient(lc.rlm_solver))
    )
    assert all(r.reward == 1.0 and r.tools for r in taught)
    assert all("Record 00150" not in json.dumps(r.messages) for r in taught)  # the sub-calls read it, not SFT
    save_dataset(taught, tmp_path / "solver")
    sft = sft_toml(tmp_path / "sft.toml", tmp_path / "solver", tmp_path / "sft")
    assert main(["train", "sft", str(sft), "--quiet"]) == 0, capsys.readouterr().err
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

    rl = rl_toml(
        tmp_path / "rl.toml",
        model,
        tmp_path / "rl",
        "long_context_qa",
        "{num_examples = 4, records = 200, limits = {call_seconds = 5.0}}",
    )
    code = main(["train", "rl", str(rl), "--quiet"])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0]  # (a random tiny model earns no reward: no signal yet)
    assert [r["step"] for r in steps] == [1, 2] and all(r["groups"] == 2 and r["errors"] == 0 for r in steps)
    assert all(r["metrics/exact_answer"] == r["reward"] for r in steps)  # scored by the FINAL answer
    assert live_workers() == 0 and not sandbox_processes()
