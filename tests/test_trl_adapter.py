"""TRL's ``GRPOTrainer`` on tic-tac-toe through ``palaestra.interop.trl``, on a tiny model, on a CPU.

The rollouts TRL trains on (ids, the environment mask it applies, the rewards its reward function
sees) must be the ones palaestra's engine samples for the same seed and weights; and bad input
(a dataset not built by the adapter, the reward function without the rollout function, a client
without token ids) is one clear error.
"""

from __future__ import annotations

import asyncio
import copy
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.interop.trl import (
    EXAMPLE_KEY,
    PalaestraRollouts,
    palaestra_reward,
    rollout_fields,
    train_dataset,
    trl_fields,
)
from palaestra.train.rl_rollouts import collect
from palaestra.train.rollout_tokens import TokenError
from palaestra.types import RunSpec, Sampling

pytest.importorskip("datasets")

GROUP = 2
SAMPLING = Sampling(temperature=1.0, max_tokens=6)


def digit_share(completion: pa.Messages) -> float:
    """A reward a random model's replies already spread (every game of it is a loss)."""
    text = "".join(str(m.get("content") or "") for m in completion if m["role"] == "assistant")
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def tictactoe_env() -> pa.Environment:
    env = pa.load_environment("tictactoe", num_examples=6, max_turns=3)
    env.rubric.add(digit_share, weight=1.0)
    return env


def recording(seen: list[tuple[list[int], float | None]]) -> Any:
    """``palaestra_reward`` that keeps what TRL scored: (completion ids, reward) pairs."""

    def palaestra_reward_seen(completions: list[Any], completion_ids: list[list[int]], **kwargs: Any) -> Any:
        rewards = palaestra_reward(completions, **kwargs)
        seen.extend(zip(completion_ids, rewards, strict=True))
        return rewards

    return palaestra_reward_seen


def trainer_for(
    model_dir: Path, tmp_path: Path, env: pa.Environment, rollouts: PalaestraRollouts, reward: Any
) -> Any:
    trl = pytest.importorskip("trl")
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=GROUP,
        learning_rate=1e-3,
        beta=0.0,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        bf16=False,  # fp32, as palaestra samples on a CPU
    )
    return trl.GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=reward,
        args=args,
        train_dataset=train_dataset(env),
        rollout_func=rollouts,
    )


async def palaestra_run(
    env: pa.Environment, model: Any, tokenizer: Any, ids: list[int], spec: RunSpec
) -> list[pa.Rollout]:
    """The rollouts ``palaestra eval`` samples for examples ``ids`` from ``model``."""
    client = pa.LocalClient.from_model(model, tokenizer)
    try:
        return await collect(env, client, [env.examples[i] for i in ids], spec)
    finally:
        await client.aclose()


def test_grpo_trains_on_the_rollouts_palaestra_samples(
    tiny_tictactoe_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    env = tictactoe_env()
    rollouts = PalaestraRollouts(env, sampling=SAMPLING, seed=5)
    scored: list[tuple[list[int], float | None]] = []
    trainer = trainer_for(tiny_tictactoe_model_dir, tmp_path, env, rollouts, recording(scored))
    before = copy.deepcopy(trainer.model)  # the weights the first batch is sampled with
    spec = RunSpec(
        rollouts_per_example=GROUP, seed=rollouts.seed_for(0), sampling=replace(SAMPLING, logprobs=True)
    )

    trained: list[dict[str, Any]] = []  # what TRL's loss sees, step by step
    compute_loss = trainer.compute_loss

    def spy(model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        trained.append(
            {**{k: v.clone() for k, v in inputs.items() if hasattr(v, "clone")}, "training": model.training}
        )
        return compute_loss(model, inputs, *args, **kwargs)

    monkeypatch.setattr(trainer, "compute_loss", spy)
    first_batch: list[pa.Rollout] = []
    ours: list[pa.Rollout] = []  # palaestra's engine on the first batch's examples, same weights and seed
    real_call = PalaestraRollouts.__call__

    def call(self: PalaestraRollouts, prompts: list[Any], trl_trainer: Any) -> dict[str, list[Any]]:
        if not first_batch:  # here: inside train() the same weights gave other logits than after it
            ids = sorted({p[0][EXAMPLE_KEY] for p in prompts})
            ours.extend(asyncio.run(palaestra_run(env, before, trl_trainer.processing_class, ids, spec)))
        out = real_call(self, prompts, trl_trainer)
        if not first_batch:
            first_batch.extend(self.last_rollouts)
        return out

    monkeypatch.setattr(PalaestraRollouts, "__call__", call)
    try:
        trainer.train()
    finally:
        rollouts.close()
    assert trainer.state.global_step == 2 and len(trained) == 2
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert all(r["training"] for r in trained)  # TRL's train mode survives the rollouts
    assert len(first_batch) == 4 and len({r.example_id for r in first_batch}) == 2

    def key(r: pa.Rollout) -> tuple[int, int]:
        return (r.example_id, r.rollout_index)

    assert [key(r) for r in ours] == sorted(key(r) for r in first_batch)
    for mine, theirs in zip(ours, sorted(first_batch, key=key), strict=True):
        assert [t.token_ids for t in mine.turns] == [t.token_ids for t in theirs.turns]
        assert mine.reward == theirs.reward and mine.metrics == theirs.metrics

    # what TRL trained on at step 1: these rollouts' ids, environment tokens masked, their rewards
    batch = trained[0]
    rows = []
    for i in range(batch["completion_ids"].shape[0]):
        n = int(batch["completion_mask"][i].sum())
        rows.append((batch["completion_ids"][i, :n].tolist(), batch["tool_mask"][i, :n].tolist()))
    expected = []
    for rollout in ours:
        _, completion, mask, _ = rollout_fields(rollout, trainer.processing_class)
        expected.append((completion, mask))
    assert sorted(rows) == sorted(expected)
    assert any(0 in mask for _, mask in expected)  # a multi-turn game: the environment's tokens are masked
    for rollout, (completion, mask) in zip(ours, expected, strict=True):
        sampled = [t for t, m in zip(completion, mask, strict=True) if m]
        assert sampled == [i for turn in rollout.turns for i in turn.token_ids or []]
    # the rewards TRL computed its advantages from are the rubric's
    assert sorted(map(str, scored[: len(ours)])) == sorted(
        str((c, r.reward)) for (c, _), r in zip(expected, ours, strict=True)
    )
    assert not [
        r for r in caplog.records if r.name == "palaestra.interop.trl"
    ]  # every game made one sequence
    assert len({r.reward for r in ours}) > 1  # a learning signal: the step changed the weights


def test_a_prompt_not_from_the_adapters_dataset_is_refused() -> None:
    env = tictactoe_env()
    rollouts = PalaestraRollouts(env)
    with pytest.raises(
        ValueError, match=r"build the train dataset with palaestra\.interop\.trl\.train_dataset"
    ):
        rollouts._example([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="prompt of example 99, which the environment does not have"):
        rollouts._example([{"role": "user", "content": "hi", EXAMPLE_KEY: 99}])
    rows = train_dataset(env, num_examples=3)
    assert rows["example_id"] == [0, 1, 2]
    assert [rollouts._example(p).id for p in rows["prompt"]] == [0, 1, 2]  # the id survives Arrow


def test_the_reward_function_needs_the_rollout_function() -> None:
    with pytest.raises(ValueError, match="pass rollout_func=PalaestraRollouts"):
        palaestra_reward(["a reply"])
    with pytest.raises(ValueError, match="2 rewards for 1 completions"):
        palaestra_reward(["a reply"], palaestra_reward=[1.0, 0.0])
    assert palaestra_reward(["a", "b"], palaestra_reward=[0.5, None]) == [0.5, None]


def test_a_client_without_token_ids_and_a_failed_rollout() -> None:
    env = tictactoe_env()
    [scripted] = asyncio.run(env.run(pa.ScriptedClient(lambda: "<move>4</move>"), RunSpec(num_examples=1)))
    with pytest.raises(TokenError, match="TRL needs each turn's prompt ids, completion ids and logprobs"):
        rollout_fields(scripted, tokenizer=None)

    class Tokenizer:  # the chat template and ids of a failed first turn's placeholder
        eos_token_id = 7

        def apply_chat_template(self, messages: Any, **kwargs: Any) -> str:
            return "x" * len(messages)

        def __call__(self, text: str, add_special_tokens: bool) -> dict[str, list[int]]:
            return {"input_ids": [1] * len(text)}

    failed = pa.Rollout(example_id=0, rollout_index=0, seed=0, prompt=[{"role": "user", "content": "hi"}])
    failed.error = pa.ErrorInfo("ModelError", "down", "model")
    assert rollout_fields(failed, Tokenizer()) == ([1], [7], [0], [0.0])
    fields = trl_fields([failed], Tokenizer())
    assert fields["palaestra_reward"] == [None] and fields["env_mask"] == [[0]]
