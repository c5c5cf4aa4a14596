"""Summary statistics of an eval run.

``summarize`` turns rollouts into a JSON-ready dict (saved with a run and read back by the
report; ``palaestra.eval.summary_view`` prints it) and ``pick_sample`` chooses which rollout to
show in full.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from palaestra.types import Rollout

HISTOGRAM_BINS = 10
ERROR_MESSAGE_CHARS = 500
TIMING_STAGES = ("model", "env", "scoring", "total")

# Exact t(0.975, df) for df = 1..30 (9 decimals); larger df use the Cornish-Fisher expansion.
_T975 = (
    12.706204736,
    4.302652730,
    3.182446305,
    2.776445105,
    2.570581836,
    2.446911851,
    2.364624252,
    2.306004135,
    2.262157163,
    2.228138852,
    2.200985160,
    2.178812830,
    2.160368656,
    2.144786688,
    2.131449546,
    2.119905299,
    2.109815578,
    2.100922040,
    2.093024054,
    2.085963447,
    2.079613845,
    2.073873068,
    2.068657610,
    2.063898562,
    2.059538553,
    2.055529439,
    2.051830516,
    2.048407142,
    2.045229642,
    2.042272456,
)
_Z975 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """The Student t quantile t(0.975, df), for a two-sided 95% confidence interval.

    df <= 30 comes from a table of exact values; above that, the Cornish-Fisher expansion of
    the normal quantile (Abramowitz & Stegun 26.7.5, four terms), whose error is below 3e-8.
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one example: chance that k of its n rollouts (c passing) include a pass."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(
    rollouts: Sequence[Rollout],
    *,
    rollouts_per_example: int,
    pass_threshold: float = 0.5,
    env_metrics: Mapping[str, Sequence[str]] | None = None,
    env_thresholds: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Reward, metric, pass@k, stop-reason, error, timing and token statistics of a run.

    The result is JSON-ready (non-finite statistics become ``None``). Rollouts whose reward is
    ``None`` (they failed, or scoring failed) are left out of reward statistics and count as fails
    in pass@k. The 95% CI of the mean reward is a t-interval clipped to the lowest and highest
    reward seen. Rollouts of an ``EnvGroup`` also get ``by_env``: the same reward, metric and
    pass@k statistics per environment, with only the metrics ``env_metrics`` names for it (all,
    when it does not name the environment), and pass@k against each one's own threshold
    (``env_thresholds``; the top-level pass@k too: a rollout passes by its environment's). A
    top-level metric's statistics are over the rows of the environments that have it, never the
    zeros the group fills in for the others.
    """
    thresholds = env_thresholds or {}
    rewards = [r.reward for r in rollouts if r.reward is not None]
    out: dict[str, Any] = {
        "n_rollouts": len(rollouts),
        "n_examples": len({r.example_id for r in rollouts}),
        "rollouts_per_example": rollouts_per_example,
        "reward": _reward_stats(rewards),
        "metrics": _metric_stats(rollouts, owners=_owners(env_metrics)),
        "histogram": _histogram(rewards),
        "pass_threshold": pass_threshold,
        "pass_at_k": _pass_at_k(rollouts, rollouts_per_example, pass_threshold, thresholds),
        "stop_reasons": _stop_reasons(rollouts),
        "errors": _errors(rollouts),
        "timing": {
            stage: _min_mean_max([getattr(r.timing, stage) for r in rollouts]) for stage in TIMING_STAGES
        },
        "tokens": {
            "prompt": sum(r.usage.prompt_tokens for r in rollouts),
            "completion": sum(r.usage.completion_tokens for r in rollouts),
            "total": sum(r.usage.prompt_tokens + r.usage.completion_tokens for r in rollouts),
        },
    }
    names = sorted({r.env for r in rollouts if r.env is not None})
    if names:
        by_env: dict[str, Any] = {}
        for name in names:
            own = [r for r in rollouts if r.env == name]
            shown = (env_metrics or {}).get(name)
            by_env[name] = {
                "n_rollouts": len(own),
                "n_examples": len({r.example_id for r in own}),
                "reward": _reward_stats([r.reward for r in own if r.reward is not None]),
                "metrics": _metric_stats(own, None if shown is None else set(shown)),
                "pass_threshold": thresholds.get(name, pass_threshold),
                "pass_at_k": _pass_at_k(own, rollouts_per_example, thresholds.get(name, pass_threshold)),
                "errors": sum(r.error is not None for r in own),
            }
        out["by_env"] = by_env
    return out


def _owners(env_metrics: Mapping[str, Sequence[str]] | None) -> dict[str, set[str]] | None:
    """Metric name → the environments that have it (None: no group, every row has every metric)."""
    if not env_metrics:
        return None
    owners: dict[str, set[str]] = {}
    for env, names in env_metrics.items():
        for name in names:
            owners.setdefault(name, set()).add(env)
    return owners


def _metric_stats(
    rollouts: Sequence[Rollout], only: set[str] | None = None, *, owners: dict[str, set[str]] | None = None
) -> dict[str, Any]:
    """Each metric's statistics; with ``owners``, over the rows of the environments that have it."""
    values: dict[str, list[float]] = {}
    for r in rollouts:
        for name, value in r.metrics.items():
            if value is None or (only is not None and name not in only):
                continue
            if owners is not None and r.env is not None and r.env not in owners.get(name, {r.env}):
                continue  # the 0.0 a group fills in for another environment's metric
            values.setdefault(name, []).append(value)
    return {
        name: {"mean": _mean(vs), "std": _std(vs), "n": len(vs), **_min_max(vs)}
        for name, vs in sorted(values.items())
    }


def _min_max(values: Sequence[float]) -> dict[str, float | None]:
    """The lowest and highest finite values (the report draws each metric on its own scale)."""
    finite = [v for v in values if math.isfinite(v)]
    return {"min": min(finite), "max": max(finite)} if finite else {"min": None, "max": None}


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _mean(values: Sequence[float]) -> float | None:
    return _finite(math.fsum(values) / len(values)) if values else None


def _std(values: Sequence[float]) -> float | None:
    """Sample standard deviation; 0.0 for one value, ``None`` for none."""
    if not values:
        return None
    if len(values) == 1:
        return 0.0 if math.isfinite(values[0]) else None
    mean = math.fsum(values) / len(values)
    return _finite(math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)))


def _min_mean_max(values: Sequence[float]) -> dict[str, float | None]:
    if not values or any(math.isnan(v) for v in values):
        return {"min": None, "mean": _mean(values), "max": None}
    return {"min": _finite(min(values)), "mean": _mean(values), "max": _finite(max(values))}


def _reward_stats(rewards: Sequence[float]) -> dict[str, Any]:
    n = len(rewards)
    mean, std = _mean(rewards), _std(rewards)
    ci95 = None
    spread = _min_mean_max(rewards)
    if (
        n >= 2
        and mean is not None
        and std is not None
        and spread["min"] is not None
        and spread["max"] is not None
    ):
        half = t_quantile_975(n - 1) * std / math.sqrt(n)
        # clipped to the rewards seen: a bounded reward's t-interval can overshoot its bounds
        ci95 = [max(mean - half, spread["min"]), min(mean + half, spread["max"])]
    return {"mean": mean, "std": std, "ci95": ci95, "min": spread["min"], "max": spread["max"], "n": n}


def _histogram(rewards: Sequence[float]) -> dict[str, list[Any]]:
    """Ten equal bins over [min(0, lowest), max(1, highest)]; the top value falls in the last bin."""
    finite = [r for r in rewards if math.isfinite(r)]
    lo = min([0.0, *finite])
    hi = max([1.0, *finite])
    edges = [round(lo + (hi - lo) * i / HISTOGRAM_BINS, 12) for i in range(HISTOGRAM_BINS + 1)]
    edges[0], edges[-1] = lo, hi
    counts = [0] * HISTOGRAM_BINS
    for r in finite:
        counts[min(max(bisect_right(edges, r) - 1, 0), HISTOGRAM_BINS - 1)] += 1
    return {"edges": edges, "counts": counts}


def _pass_at_k(
    rollouts: Sequence[Rollout],
    rollouts_per_example: int,
    threshold: float,
    env_thresholds: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """pass@k for k = 1, 2, 4, ... <= rollouts_per_example, averaged over examples with >= k rollouts.

    A rollout passes at its environment's threshold (``env_thresholds``), else at ``threshold``.
    A k that no example has enough rollouts for is left out.
    """
    per_example: dict[int, list[bool]] = {}
    for r in rollouts:
        bar = (env_thresholds or {}).get(r.env or "", threshold)
        per_example.setdefault(r.example_id, []).append(r.reward is not None and r.reward >= bar)
    out: dict[str, float] = {}
    k = 1
    while per_example and k <= rollouts_per_example:
        scores = [pass_at_k(len(p), sum(p), k) for p in per_example.values() if len(p) >= k]
        if scores:
            out[str(k)] = math.fsum(scores) / len(scores)
        k *= 2
    return out


def _stop_reasons(rollouts: Sequence[Rollout]) -> dict[str, int]:
    counts = Counter(r.stop_reason if r.stop_reason is not None else "none" for r in rollouts)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _errors(rollouts: Sequence[Rollout]) -> list[dict[str, Any]]:
    """Errors grouped by (stage, type); each group's example is its lowest (example_id, rollout_index)."""
    groups: dict[tuple[str, str], list[Rollout]] = {}
    for r in rollouts:
        if r.error is not None:
            groups.setdefault((r.error.stage, r.error.type), []).append(r)
    out = []
    for (stage, type_), members in groups.items():
        first = min(members, key=lambda r: (r.example_id, r.rollout_index))
        assert first.error is not None  # grouped only rollouts with an error
        example = {
            "example_id": first.example_id,
            "rollout_index": first.rollout_index,
            "message": first.error.message[:ERROR_MESSAGE_CHARS],
        }
        out.append({"type": type_, "stage": stage, "count": len(members), "example": example})
    return sorted(out, key=lambda e: (-e["count"], e["stage"], e["type"]))


_SHAPE: dict[str, type | tuple[type, ...]] = {
    "n_rollouts": int,
    "n_examples": int,
    "rollouts_per_example": int,
    "reward": dict,
    "metrics": dict,
    "histogram": dict,
    "pass_threshold": (int, float),
    "pass_at_k": dict,
    "stop_reasons": dict,
    "errors": list,
    "timing": dict,
    "tokens": dict,
}


def summary_problem(summary: Any) -> str | None:
    """Why ``summary`` is not what ``summarize`` writes (a saved file edited or damaged), or None."""
    if not isinstance(summary, dict):
        return "not an object"
    for key, kind in _SHAPE.items():
        if not isinstance(summary.get(key), kind) or isinstance(summary.get(key), bool):
            return f"{key!r} is missing or not a {getattr(kind, '__name__', 'number')}"
    reward = summary["reward"]
    if not all(_number_or_none(reward.get(k)) for k in ("mean", "std", "min", "max")):
        return "'reward' holds a value that is not a number"
    ci = reward.get("ci95")
    if ci is not None and not (isinstance(ci, list) and len(ci) == 2 and all(_number_or_none(x) for x in ci)):
        return "'reward.ci95' is not a pair of numbers"
    if not isinstance(reward.get("n"), int):
        return "'reward.n' is not an integer"
    hist = summary["histogram"]
    counts, edges = hist.get("counts"), hist.get("edges")
    if not (isinstance(counts, list) and isinstance(edges, list) and len(edges) == len(counts) + 1):
        return "'histogram' does not hold counts and edges"
    if not all(isinstance(c, int) for c in counts) or not all(_number_or_none(e) for e in edges):
        return "'histogram' holds a value that is not a number"
    for key in ("metrics", "timing"):
        for name, stats in summary[key].items():
            if not isinstance(stats, dict) or not all(_number_or_none(v) for v in stats.values()):
                return f"{key}[{name!r}] is not an object of numbers"
    for key in ("pass_at_k", "stop_reasons", "tokens"):
        if not all(_number_or_none(v) and v is not None for v in summary[key].values()):
            return f"{key!r} holds a value that is not a number"
    for error in summary["errors"]:
        example = error.get("example") if isinstance(error, dict) else None
        if not (
            isinstance(error, dict)
            and isinstance(error.get("count"), int)
            and isinstance(example, dict)
            and isinstance(example.get("message"), str)
        ):
            return "'errors' holds an entry that is not an error group"
    return None


def _number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def pick_sample(rollouts: Sequence[Rollout]) -> Rollout | None:
    """The rollout to show: median reward among error-free ones (ties: lowest ids), else the first."""
    ok = [r for r in rollouts if r.error is None and r.reward is not None and not math.isnan(r.reward)]
    if not ok:
        return rollouts[0] if rollouts else None
    median = sorted(r.reward for r in ok if r.reward is not None)[(len(ok) - 1) // 2]  # an actual reward
    return min((r for r in ok if r.reward == median), key=lambda r: (r.example_id, r.rollout_index))


# ---------------------------------------------------------------- rendering
