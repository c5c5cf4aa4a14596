"""What an RL step leaves behind: its record in ``metrics.jsonl`` and its progress line, the
held-out sets played every ``eval.every`` steps, and the samples of its batch saved as runs
``palaestra report`` opens."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from palaestra.clients.base import ModelClient
from palaestra.envs.base import Environment
from palaestra.eval.run import evaluate
from palaestra.eval.store import RunMetadata, RunStore
from palaestra.parsers import Parser
from palaestra.train.metrics import TrainProgress
from palaestra.train.rl_config import RLConfig
from palaestra.train.signal import advantage_balance, flat_groups, unparsed
from palaestra.types import Rollout, RunSpec, Sampling


def step_record(
    step: int,
    rollouts: list[Rollout],
    advantages: Any,
    stats: Any,
    lr: float,
    sampling_s: float,
    training_s: float,
    parser: Parser | None = None,
) -> dict[str, Any]:
    """What one step logs: rewards and metrics of its rollouts, what they offer to learn from
    (``signal.py``; ``parser`` reads the final replies), the update's figures, the time split."""
    scored = [r for r in rollouts if r.reward is not None]
    turns = [t for r in rollouts for t in r.turns]
    sampled = sum(len(t.token_ids or ()) for t in turns)
    flat_share, flat_reward = flat_groups(rollouts)
    record: dict[str, Any] = {
        "step": step,
        "reward": _mean([r.reward for r in scored if r.reward is not None]),
        "errors": sum(r.error is not None for r in rollouts),
        "zero_groups": advantages.zero_groups,
        "groups": advantages.groups,
        "flat_groups": flat_share,
        "flat_reward": flat_reward,
        "unparsed": unparsed(rollouts, parser),
        "advantage_balance": advantage_balance(advantages.rollouts, advantages.values),
        "completion_tokens": sampled / max(len(turns), 1),
        "truncated": sum(t.finish_reason == "length" for t in turns) / max(len(turns), 1),
        "lr": lr,
        "seconds_sampling": sampling_s,
        "seconds_training": training_s,
        "seconds": sampling_s + training_s,
        "sampled_tokens_per_s": sampled / max(sampling_s, 1e-9),
    }
    for name in sorted({m for r in scored for m in r.metrics}):
        record[f"metrics/{name}"] = _mean([r.metrics[name] for r in scored if name in r.metrics])
    for env in sorted({r.env for r in rollouts if r.env is not None}):  # an EnvGroup: each one's reward
        record[f"reward/{env}"] = _mean([r.reward for r in scored if r.env == env and r.reward is not None])
    if stats is not None:
        record.update(
            loss=stats.loss,
            grad_norm=stats.grad_norm,
            trained_tokens=stats.trained_tokens,
            clipped_fraction=stats.clipped_fraction,
            ratio_mean=stats.ratio_mean,
            entropy=stats.entropy,
            trained_tokens_per_s=stats.trained_tokens / max(training_s, 1e-9),
            shared_prefix=stats.shared_prefix,
        )
        if stats.kl is not None:
            record["kl"] = stats.kl
        record.update({f"mismatch/{name}": value for name, value in stats.mismatch.items()})
    return record


class RLProgress(TrainProgress):
    label = "rl"

    def stats(self, record: dict[str, Any]) -> str:
        reward = record.get("reward")
        loss = record.get("loss")
        held_out = record.get("eval/reward")
        return (
            f"reward {reward if reward is None else f'{reward:.3f}'}  "
            + (f"held-out {held_out:.3f}  " if held_out is not None else "")
            + (f"loss {loss:.4f}  entropy {record['entropy']:.3f}  " if loss is not None else "no signal  ")
            + f"{record['seconds_sampling']:.0f}s sampling, {record['seconds_training']:.0f}s training"
        )


async def evaluate_sets(
    eval_envs: list[tuple[str, Environment]], client: ModelClient, config: RLConfig, run_dir: Path, step: int
) -> dict[str, float | None]:
    """Each held-out set, one rollout per example, saved as a run in ``RUN_DIR/evals/step-N/SET``;
    its means logged as ``eval/SET/...``."""
    out: dict[str, float | None] = {}
    sampling = Sampling(temperature=config.eval.temperature, max_tokens=config.sampling.max_tokens)
    rewards = []
    for (name, env), eval_set in zip(eval_envs, config.eval.sets, strict=True):
        spec = RunSpec(
            num_examples=min(config.eval.num_examples, len(env.examples)),
            max_concurrent=config.train.max_concurrent,
            sampling=sampling,
        )
        run = await evaluate(
            env, client, spec, output_dir=None, env_id=f"{config.env.id}-{name}", env_args=eval_set.args
        )
        save_run(run_dir / "evals" / f"step-{step:06d}" / name, run.rollouts, run.metadata)
        summary = run.summary
        out[f"eval/{name}/reward"] = summary["reward"]["mean"]
        rewards.append(summary["reward"]["mean"])
        for metric, stats in summary["metrics"].items():
            out[f"eval/{name}/{metric}"] = stats["mean"]
        for env_name, stats in (summary.get("by_env") or {}).items():  # an EnvGroup: each one's reward
            out[f"eval/{name}/reward/{env_name}"] = stats["reward"]["mean"]
    known = [r for r in rewards if r is not None]
    out["eval/reward"] = _mean(known) if known else None
    return out


def sample_metadata(
    rollouts: list[Rollout],
    config: RLConfig,
    spec: RunSpec,
    run_id: str,
    *,
    version: int,
    started: time.struct_time,
) -> RunMetadata:
    """A saved sample's header: the policy version that sampled it, its groups, and when its step ran."""
    from palaestra.eval.summary import summarize

    groups = len({r.example_id for r in rollouts})
    model = f"{config.model.path or 'tiny model'} @ policy version {version}"
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    return RunMetadata(
        env_id=config.env.id,
        model=model,
        spec=dataclasses.replace(spec, num_examples=groups),
        env_args=config.env.args,
        run_id=run_id,
        status="complete",
        started_at=time.strftime(stamp, started),
        finished_at=time.strftime(stamp, time.gmtime()),
        counts={
            "expected": len(rollouts),
            "saved": len(rollouts),
            "errors": sum(r.error is not None for r in rollouts),
        },
        summary=summarize(rollouts, rollouts_per_example=spec.rollouts_per_example),
    )


def save_run(path: Path, rollouts: list[Rollout], metadata: RunMetadata) -> None:
    """``rollouts`` as a saved run at ``path`` (``palaestra report PATH`` opens it)."""
    path.mkdir(parents=True, exist_ok=True)
    store = RunStore(path)
    store.rewrite(rollouts)
    store.write_metadata(metadata)


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None
