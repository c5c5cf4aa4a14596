"""Why an RL run does (not) learn: its ``metrics.jsonl`` read back, the likely causes named.

``palaestra train diagnose RUN_DIR`` prints, for the first and the last quarter of the run's
steps, the figures that tell what a batch offered to learn from (``signal.py``) and how the policy
moved, then one line per finding: what is wrong, in numbers, and what to change. The rules are
the causes found by hand in this project's runs: a reward every rollout of a group shares (no
signal), replies cut at ``max_tokens`` or without a parsable answer, an update that pushes the
shared tokens down, entropy collapse, sampler and trainer disagreeing, held-out reward falling
while the training reward rises. Pure functions over the records; the CLI only prints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from palaestra.train.metrics import METRICS_FILE, read_metrics

Level = Literal["problem", "warning", "ok"]
# (key, label, format) of the summary table, in order
FIGURES = (
    ("reward", "training reward", ".3f"),
    ("eval/reward", "held-out reward", ".3f"),
    ("flat_groups", "groups with one reward (no signal)", ".0%"),
    ("flat_reward", "reward of those groups", ".3f"),
    ("truncated", "replies cut at max_tokens", ".1%"),
    ("unparsed", "final replies without an answer", ".1%"),
    ("advantage_balance", "advantage balance (Σ A·n / Σ |A|·n)", "+.2f"),
    ("completion_tokens", "tokens per reply", ".1f"),
    ("entropy", "entropy of sampled tokens (nats)", ".3f"),
    ("mismatch/kl", "sampler-trainer KL per token", ".2e"),
    ("clipped_fraction", "tokens clipped by the loss", ".1%"),
    ("errors", "failed rollouts per step", ".1f"),
)


@dataclass(frozen=True)
class Finding:
    level: Level
    text: str

    def __str__(self) -> str:
        return f"{self.level}: {self.text}"


def steps(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The training steps' records (a run's step-0 record holds only its first evaluation)."""
    return [r for r in records if isinstance(r.get("step"), int) and "seconds_sampling" in r]


def window_mean(records: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return math.fsum(values) / len(values) if values else None


def _flat(record: dict[str, Any]) -> dict[str, Any]:
    """A record with ``flat_groups`` (from ``zero_groups`` / ``groups`` in runs older than it)."""
    if "flat_groups" not in record and record.get("groups"):
        return {**record, "flat_groups": record.get("zero_groups", 0) / record["groups"]}
    return record


def quarters(records: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first and the last quarter of the training steps (at least one step each)."""
    train = [_flat(r) for r in steps(records)]
    n = max(1, len(train) // 4)
    return train[:n], train[-n:]


def evaluations(records: Sequence[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, held-out reward) of every evaluation, the one before the first step included."""
    return [
        (int(r["step"]), float(r["eval/reward"]))
        for r in records
        if isinstance(r.get("eval/reward"), (int, float)) and math.isfinite(r["eval/reward"])
    ]


def diagnose(records: Sequence[dict[str, Any]], config: dict[str, Any] | None = None) -> list[Finding]:
    """The findings of a run's records (``config``: its ``config.toml`` as a dict, for the advice)."""
    config = config or {}
    sampling, train = config.get("sampling", {}), config.get("train", {})
    temperature, max_tokens = sampling.get("temperature", "?"), sampling.get("max_tokens", "?")
    group = train.get("rollouts_per_example", "?")
    first, last = quarters(records)
    if not first:
        return [Finding("problem", "no training step is logged yet")]
    out: list[Finding] = []

    def early(key: str) -> float | None:
        return window_mean(first, key)

    def late(key: str) -> float | None:
        return window_mean(last, key)

    batch = train.get("batch_size")
    errors = window_mean(steps(records), "errors")
    if errors and batch and errors / batch >= 0.05:
        out.append(
            Finding(
                "problem", f"{errors / batch:.0%} of rollouts fail (an error, not a score): read their errors"
            )
        )
    flat, flat_reward = late("flat_groups"), late("flat_reward")
    if flat is not None and flat >= 0.5:
        where = f" (their rollouts all scored {flat_reward:.2f})" if flat_reward is not None else ""
        mean = late("reward")
        if flat_reward is not None and mean is not None and flat_reward < mean:
            advice = (
                "most of them fail every attempt: start from a stronger SFT model, easier examples, "
                "or a graded reward"
            )
        elif flat_reward is not None and mean is not None and flat_reward > mean:
            advice = "most of them succeed every attempt: harder examples would carry more signal"
        else:
            advice = f"raise the temperature ({temperature}), the group size ({group}), or grade the reward"
        out.append(Finding("problem", f"{flat:.0%} of groups have one reward{where}: no signal; {advice}"))
    truncated = late("truncated")
    if truncated is not None and truncated >= 0.1:
        out.append(
            Finding(
                "problem",
                f"{truncated:.0%} of replies hit max_tokens ({max_tokens}): raise sampling.max_tokens or "
                "teach shorter replies (SFT); a cut reply rarely scores",
            )
        )
    unparsed = late("unparsed")
    if unparsed is not None and unparsed >= 0.2:
        out.append(
            Finding(
                "problem",
                f"{unparsed:.0%} of final replies hold no answer the parser reads: teach the format "
                "first (SFT on the environment's replies) or give the format a reward",
            )
        )
    balance = window_mean(steps(records), "advantage_balance")
    if balance is not None and balance <= -0.2:
        out.append(
            Finding(
                "problem",
                f"the updates push sampled tokens down (advantage balance {balance:+.2f}): the worse "
                "rollouts are the longer ones, so with a token-level mean the tokens every rollout "
                'shares (format, tool-call markup) are unlearned; use loss.name = "grpo" (a '
                "per-rollout mean) or end the long failures sooner (max_turns)",
            )
        )
    e0, e1 = early("entropy"), late("entropy")
    if e0 and e1 is not None and e1 < 0.3 * e0:
        out.append(
            Finding(
                "warning",
                f"entropy fell from {e0:.3f} to {e1:.3f}: the policy is settling on few replies; if the "
                "reward stalls, lower optim.lr or raise the temperature",
            )
        )
    elif e0 and e1 is not None and e1 > 2 * e0 and e1 > 0.1:
        out.append(
            Finding(
                "problem",
                f"entropy rose from {e0:.3f} to {e1:.3f}: the policy is drifting toward noise (too high "
                "an optim.lr, or updates that push tokens down)",
            )
        )
    kl, worst = late("mismatch/kl"), window_mean(last, "mismatch/log_ratio_max")
    if (kl is not None and kl > 1e-2) or (worst is not None and worst > 2.0):
        out.append(
            Finding(
                "warning",
                f"sampler and trainer disagree (KL {kl or 0:.2e} per token, largest |Δlogp| {worst or 0:.2f}): "
                "check that both use the same weights, dtype and chat template; loss.tis_cap corrects it",
            )
        )
    clipped = late("clipped_fraction")
    if clipped is not None and clipped >= 0.2:
        out.append(
            Finding(
                "warning",
                f"{clipped:.0%} of tokens are clipped by the loss: a step moves the policy far; lower optim.lr",
            )
        )
    r0, r1 = early("reward"), late("reward")
    held = evaluations(records)
    if r0 is not None and r1 is not None:
        if held and len(held) >= 2:
            h0, h1 = held[0][1], held[-1][1]
            if r1 - r0 >= 0.02 and h1 - h0 <= -0.02:
                out.append(
                    Finding(
                        "problem",
                        f"training reward rose ({r0:.3f} → {r1:.3f}) while held-out fell ({h0:.3f} at step "
                        f"{held[0][0]} → {h1:.3f} at step {held[-1][0]}): the policy fits the training "
                        "examples or exploits the reward; read the samples (palaestra report RUN/samples/...)",
                    )
                )
            elif h1 - h0 <= -0.02:
                out.append(Finding("problem", f"held-out reward fell from {h0:.3f} to {h1:.3f}"))
            elif h1 - h0 >= 0.02:
                out.append(Finding("ok", f"held-out reward rose from {h0:.3f} to {h1:.3f}"))
            else:
                out.append(Finding("warning", f"held-out reward did not move ({h0:.3f} → {h1:.3f})"))
        elif r1 - r0 <= -0.02:
            out.append(Finding("problem", f"training reward fell from {r0:.3f} to {r1:.3f}"))
        elif r1 - r0 >= 0.02:
            out.append(Finding("ok", f"training reward rose from {r0:.3f} to {r1:.3f}"))
    if not any(f.level != "ok" for f in out):
        out.append(Finding("ok", "nothing the rules know looks wrong"))
    return out


def report(run_dir: Path) -> str:
    """The text ``palaestra train diagnose RUN_DIR`` prints: the figures, then the findings."""
    import tomllib

    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no {METRICS_FILE} (is it an RL run folder?)")
    records = read_metrics(path)
    config_file = run_dir / "config.toml"
    config = tomllib.loads(config_file.read_text()) if config_file.is_file() else {}
    if records and not any("reward" in r or "eval/reward" in r for r in records):
        raise ValueError(f"{run_dir} is not an RL run (its metrics have no reward)")
    first, last = quarters(records)
    lines = []
    if first:
        lines.append(
            f"{run_dir}: {len(steps(records))} steps; first quarter (steps {first[0]['step']}-"
            f"{first[-1]['step']}) → last quarter (steps {last[0]['step']}-{last[-1]['step']})"
        )
        held = dict(evaluations(records))
        for key, label, spec in FIGURES:
            if key == "eval/reward":
                if len(held) >= 2:
                    (s0, h0), (s1, h1) = min(held.items()), max(held.items())
                    lines.append(f"  {label:<40} {h0:{spec}} (step {s0}) → {h1:{spec}} (step {s1})")
                continue
            a, b = window_mean(first, key), window_mean(last, key)
            if a is not None and b is not None:
                lines.append(f"  {label:<40} {a:{spec}} → {b:{spec}}")
        metrics = sorted({k for r in last for k in r if k.startswith("metrics/")})
        for key in metrics:
            a, b = window_mean(first, key), window_mean(last, key)
            if a is not None and b is not None:
                lines.append(f"  {key:<40} {a:.3f} → {b:.3f}")
    lines += [str(f) for f in diagnose(records, config)]
    return "\n".join(lines)
