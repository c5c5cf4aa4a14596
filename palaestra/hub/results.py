"""Eval results attached to a hub environment, and the leaderboards made of them.

``palaestra hub results RUN_DIR`` sends a saved run's ``metadata.json``; ``run_record`` keeps
what makes the run comparable and reproducible: the model, the sampling, n×r, the seed, the
environment's arguments and version, the reward with its 95% CI and every per-function mean.
Only complete runs are accepted: a partial run's mean is not the number it claims to be.

Rows are ranked only against runs of the same task: ``leaderboards`` makes one board per
(environment, environment arguments), since a different opponent or split is a different task.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from dataclasses import dataclass, field
from typing import Any

import orjson

from palaestra.eval.store import RunMetadata


class ResultError(ValueError):
    """The uploaded run cannot be attached; the message says why."""


MAX_NAME = 300  # the model, the environment and the run id: what a board shows in a cell
# what a stored run keeps, and so all that pages and the reproduce command may show: not where the
# model was served (a base_url can hold credentials or an internal host), nor which key it used
RECORD_KEYS = (
    "run_id",
    "env_id",
    "env_args",
    "model",
    "sampling",
    "num_examples",
    "rollouts_per_example",
    "seed",
    "n_rollouts",
    "reward",
    "metrics",
    "pass_at_k",
    "errors",
    "env_package",
    "env_version",
    "palaestra_version",
    "finished_at",
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _count(value: Any, where: str, default: int) -> int:
    """A non-negative integer field (``default`` when absent); ResultError naming it otherwise."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ResultError(f"{where} must be a non-negative integer, not {value!r:.100}")
    return value


def _name(value: str, where: str) -> str:
    if not value.strip() or len(value) > MAX_NAME:
        raise ResultError(f"{where} must be a non-empty string of at most {MAX_NAME} characters")
    return value


def _means(table: Any, where: str) -> dict[str, float]:
    """``{name: {"mean": x, ...}}`` or ``{name: x}`` as ``{name: x}``, keeping finite numbers only."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ResultError(f"{where} must be an object")
    out = {}
    for key, value in table.items():
        number = _number(value.get("mean") if isinstance(value, dict) else value)
        if number is not None:
            out[_name(str(key), f"a name in {where}")] = number
    return out


def public_model_name(model: str) -> str:
    """The name a board shows for ``model``: as it is, unless it is a path on the uploader's disk.

    A local checkpoint (``/home/me/outputs/sft/checkpoints/step-000040``, ``outputs/sft/final``,
    ``local:PATH``) becomes ``local:`` and its run and checkpoint names (``local:sft/step-000040``):
    the rest of the path is the uploader's own. A hub id (``org/name``) and an API model stay."""
    text = model.removeprefix("local:")
    windows = len(text) > 2 and text[1] == ":" and text[2] in "\\/"
    looks_like_path = (
        model.startswith("local:")
        or text.startswith(("/", "~", "./", "../", "\\"))
        or windows
        or text.count("/") > 1
    )
    if not looks_like_path:
        return model
    parts = [p for p in text.replace("\\", "/").split("/") if p not in ("", ".", "..", "~")]
    if len(parts) >= 3 and parts[-2] == "checkpoints":
        parts = [parts[-3], parts[-1]]  # RUN/checkpoints/step-N → RUN/step-N
    return "local:" + "/".join(parts[-2:]) if parts else "local:model"


def run_record(data: Any) -> dict[str, Any]:
    """The stored record of a run, from its ``metadata.json`` object: the fields of ``RECORD_KEYS``, typed."""
    try:
        meta = RunMetadata.from_dict(data)
    except ValueError as exc:
        raise ResultError(str(exc)) from None
    if meta.status != "complete":
        raise ResultError(
            f"the run is {meta.status}, not complete: finish it (palaestra eval --resume) first"
        )
    if not meta.run_id:
        raise ResultError("the run has no run_id")
    reward = meta.summary.get("reward")
    if not isinstance(reward, dict) or _number(reward.get("mean")) is None:
        raise ResultError("the run's summary has no reward mean")
    ci = reward.get("ci95")
    ci95 = [_number(x) for x in ci] if isinstance(ci, list) and len(ci) == 2 else [None, None]
    package = meta.versions.get("env_package") or ""
    palaestra = meta.versions.get("palaestra") or ""
    if not isinstance(package, str) or not isinstance(palaestra, str):
        raise ResultError("versions.env_package and versions.palaestra must be strings")
    spec = meta.spec
    finished = meta.finished_at or ""
    return {
        "run_id": _name(meta.run_id, "run_id"),
        "env_id": _name(meta.env_id, "env_id"),
        "env_args": meta.env_args,
        "model": _name(public_model_name(meta.model), "model"),  # never a path on the uploader's disk
        "sampling": dataclasses.asdict(spec.sampling) if spec.sampling else None,
        "num_examples": _count(meta.summary.get("n_examples"), "summary.n_examples", spec.num_examples)
        or spec.num_examples,
        "rollouts_per_example": spec.rollouts_per_example,
        "seed": spec.seed,
        "n_rollouts": _count(reward.get("n"), "summary.reward.n", 0)
        or _count(meta.summary.get("n_rollouts"), "summary.n_rollouts", 0),
        "reward": {"mean": _number(reward["mean"]), "std": _number(reward.get("std")), "ci95": ci95},
        "metrics": _means(meta.summary.get("metrics"), "summary.metrics"),
        "pass_at_k": _means(meta.summary.get("pass_at_k"), "summary.pass_at_k"),
        "errors": _count(meta.counts.get("errors"), "counts.errors", 0),
        "env_package": package[:MAX_NAME],
        "env_version": package.rpartition(" ")[2][:MAX_NAME] if " " in package else "",
        "palaestra_version": palaestra[:MAX_NAME],
        "finished_at": finished[:40] or None,
    }


def stored_record(run: dict[str, Any]) -> dict[str, Any]:
    """A record as the catalog kept it, less anything outside ``RECORD_KEYS`` (what an older hub stored)."""
    return {k: run[k] for k in RECORD_KEYS if k in run}


def reproduce_command(run: dict[str, Any]) -> str:
    """The ``palaestra eval`` command that repeats ``run`` (the sampling as it was saved; the model's
    endpoint is the reader's own: ``-b`` is not shown)."""
    parts = ["palaestra", "eval", run["env_id"], "-m", run["model"]]
    if run.get("env_args"):
        parts += ["-a", orjson.dumps(run["env_args"], option=orjson.OPT_SORT_KEYS).decode()]
    parts += [
        "-n",
        str(run["num_examples"]),
        "-r",
        str(run["rollouts_per_example"]),
        "--seed",
        str(run["seed"]),
    ]
    sampling = {k: v for k, v in (run.get("sampling") or {}).items() if v not in (None, {}, False)}
    if sampling:
        parts += ["-S", orjson.dumps(sampling, option=orjson.OPT_SORT_KEYS).decode()]
    return shlex.join(parts)


@dataclass
class Board:
    """The ranked runs of one environment with one set of arguments."""

    env_id: str
    env_args: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def metric_names(self) -> list[str]:
        return sorted({name for run in self.runs for name in run["metrics"]})


def leaderboards(results: list[dict[str, Any]]) -> list[Board]:
    """One board per (environment, arguments), best mean reward first; boards by name."""
    boards: dict[tuple[str, bytes], Board] = {}
    for run in results:
        key = (run["env_id"], orjson.dumps(run.get("env_args") or {}, option=orjson.OPT_SORT_KEYS))
        boards.setdefault(key, Board(run["env_id"], run.get("env_args") or {})).runs.append(run)
    for board in boards.values():
        board.runs.sort(key=lambda r: (-(r["reward"]["mean"] or 0.0), r.get("finished_at") or ""))
    return [boards[k] for k in sorted(boards)]
