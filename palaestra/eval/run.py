"""``evaluate``: run an environment against a model, save every rollout as it finishes, summarise.

A run is saved under ``output_dir/evals/<env>--<model>/<run-id>/`` (see ``store.py``). Each
group of rollouts is appended as soon as it is scored; ``metadata.json`` is written at the start
(status ``running``), and rewritten at the end with the summary (``complete``) or, when the run is
interrupted or fails, with what was saved (``interrupted``). The run folder is locked while a
process works on it, so two resumes of one run cannot interleave.

``resume`` finishes such a run: it keeps every complete group already saved, drops partial groups
and unreadable lines, re-runs groups whose model requests failed (a server that went away; errors
the environment or scoring raised are kept, they are results), and runs only what is missing, so
the run ends with exactly ``num_examples × rollouts_per_example`` rollouts.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from palaestra._version import __version__
from palaestra.clients.base import ModelClient
from palaestra.engine import GroupExecutor, stream_groups
from palaestra.envs.base import Environment
from palaestra.eval.progress import EvalProgress, token_counter
from palaestra.eval.store import EvalRun, RunMetadata, RunStore, RunStoreError, load_run
from palaestra.eval.summary import summarize
from palaestra.types import Example, Rollout, RunSpec

__all__ = ["EvalRun", "ResumePlan", "evaluate", "load_run", "resume_plan"]
logger = logging.getLogger("palaestra.eval")


async def evaluate(
    env: Environment,
    client: ModelClient,
    spec: RunSpec | None = None,
    *,
    output_dir: Path | str | None = "outputs",
    env_id: str = "env",
    env_args: dict[str, Any] | None = None,
    resume: Path | str | None = None,
    progress: bool | None = False,
    on_rollout: Callable[[Rollout], None] | None = None,
    on_start: Callable[[Path], None] | None = None,
    executor: GroupExecutor | None = None,
) -> EvalRun:
    """Evaluate ``client`` on ``env`` as ``spec`` says, saving each group as it is scored.

    ``output_dir=None`` keeps everything in memory. ``resume`` finishes the saved run in that
    directory with its own saved spec (``spec`` may then only change ``max_concurrent`` and
    ``max_failures_in_a_row``). ``progress``: ``True`` for a Rich bar (plain lines when stderr
    is not a terminal), ``None`` for plain lines, ``False`` for nothing. ``on_start`` gets the run
    folder once it exists. ``executor``: where the groups run (default: this process; a
    ``RayExecutor`` runs them on Ray workers, and this process still saves them). Raises
    ``ModelUnavailable`` (the run saved as ``interrupted``) when too many model requests in a row fail.
    """
    if resume is not None:
        store = RunStore.open(Path(resume))
        with store.lock() as stale:
            if stale:
                logger.warning("%s: %s", store.path, stale)
            metadata = store.read_metadata()
            if spec is not None:
                metadata.spec = metadata.spec.replace(
                    max_concurrent=spec.max_concurrent, max_failures_in_a_row=spec.max_failures_in_a_row
                )
            # where the model is reached from now on (a server that moved), so a later resume finds it
            metadata.base_url = getattr(client, "base_url", metadata.base_url)
            metadata.api_key_var = getattr(client, "api_key_var", metadata.api_key_var)
            examples = env.select(metadata.spec.num_examples)
            plan = resume_plan(store, examples, metadata.spec.rollouts_per_example)
            if plan.dropped:
                store.rewrite(plan.kept)
            if on_start is not None:
                on_start(store.path)
            return await _run(
                env, client, examples, metadata, store, plan.kept, progress, on_rollout, executor
            )
    spec = spec or RunSpec()
    examples = env.select(spec.num_examples)
    metadata = _new_metadata(env, client, env_id, env_args, spec)
    try:
        orjson.dumps(metadata.to_dict())  # fail before a run folder exists, not after
    except TypeError as exc:
        raise RunStoreError(f"this run's settings cannot be saved as JSON: {exc}") from None
    if output_dir is None:
        return await _run(env, client, examples, metadata, None, [], progress, on_rollout, executor)
    store = RunStore.create(Path(output_dir), env_id, client.model)
    metadata.run_id = store.path.name
    with store.lock():
        if on_start is not None:
            on_start(store.path)
        return await _run(env, client, examples, metadata, store, [], progress, on_rollout, executor)


async def _run(
    env: Environment,
    client: ModelClient,
    examples: list[Example],
    metadata: RunMetadata,
    store: RunStore | None,
    kept: list[Rollout],
    progress: bool | None,
    on_rollout: Callable[[Rollout], None] | None,
    executor: GroupExecutor | None = None,
) -> EvalRun:
    """Run the examples without a saved group, saving each group as it is scored."""
    spec = metadata.spec
    r = spec.rollouts_per_example
    done_ids = {rollout.example_id for rollout in kept}
    todo = [e for e in examples if e.id not in done_ids]
    metadata.status, metadata.finished_at = "running", None
    if store is not None:
        store.write_metadata(metadata)
    rollouts = list(kept)
    bar = None
    if progress is not False:  # True: a bar where stderr is a terminal; None: plain lines
        bar = EvalProgress(
            len(examples) * r,
            done=len(kept),
            plain=None if progress else True,
            live_tokens=token_counter(client),
        )
    status = "interrupted"
    try:
        stream = executor.stream_groups if executor is not None else stream_groups
        groups = stream(env, client, todo, spec)
        async with contextlib.aclosing(groups):
            with bar if bar is not None else contextlib.nullcontext():
                async for group in groups:
                    if store is not None:
                        store.append(group)
                    rollouts.extend(group)
                    for rollout in group:
                        if bar is not None:
                            bar.update(rollout)
                        if on_rollout is not None:
                            on_rollout(rollout)
        status = "complete"
    finally:
        rollouts.sort(key=lambda x: (x.example_id, x.rollout_index))
        metadata.status, metadata.finished_at = status, _now()
        metadata.counts = {
            "expected": len(examples) * r,
            "saved": len(rollouts),
            "errors": sum(x.error is not None for x in rollouts),
        }
        metadata.summary = summarize(
            rollouts,
            rollouts_per_example=r,
            pass_threshold=metadata.pass_threshold,
            env_metrics=env.env_metric_names(),
            env_thresholds=env.env_pass_thresholds(),
        )
        if metadata.notes:  # said with the results, wherever the summary is shown
            metadata.summary["notes"] = dict(metadata.notes)
        if store is not None:
            store.write_metadata(metadata)
    return EvalRun(path=store.path if store else None, metadata=metadata, rollouts=rollouts)


@dataclass
class ResumePlan:
    """What a resume keeps of a saved run, and why it drops the rest."""

    kept: list[Rollout]
    groups_total: int
    groups_kept: int
    groups_failed: int  # complete groups re-run because a model request of theirs failed
    lines_unreadable: int
    dropped: bool  # whether the results file must be rewritten to hold exactly ``kept``


def resume_plan(store: RunStore, examples: Sequence[Example], r: int) -> ResumePlan:
    """The saved rollouts a resume keeps: whole groups of wanted examples, none with a model error."""
    saved, skipped = store.load_rollouts()
    by_example: dict[int, dict[int, Rollout]] = defaultdict(dict)
    for rollout in saved:
        by_example[rollout.example_id].setdefault(rollout.rollout_index, rollout)
    wanted = {e.id for e in examples}
    kept: list[Rollout] = []
    failed = 0
    for example_id, group in sorted(by_example.items()):
        if example_id not in wanted or set(group) != set(range(r)):
            continue
        if any(x.error is not None and x.error.stage == "model" for x in group.values()):
            failed += 1
            continue
        kept.extend(group[i] for i in range(r))
    return ResumePlan(
        kept=kept,
        groups_total=len(examples),
        groups_kept=len(kept) // r,
        groups_failed=failed,
        lines_unreadable=len(skipped),
        dropped=bool(skipped) or len(kept) != len(saved),
    )


def _new_metadata(
    env: Environment, client: ModelClient, env_id: str, env_args: dict[str, Any] | None, spec: RunSpec
) -> RunMetadata:
    return RunMetadata(
        env_id=env_id,
        model=client.model,
        spec=spec.replace(sampling=spec.sampling or env.sampling),
        env_args=env_args or {},
        base_url=getattr(client, "base_url", None),
        api_key_var=getattr(client, "api_key_var", None),
        pass_threshold=env.pass_threshold,
        rubric=env.metric_info(),
        versions={
            "palaestra": __version__,
            "env_package": _env_package(env_id),
            "python": platform.python_version(),
        },
        started_at=_now(),
        notes=env.run_notes(),
    )


def _env_package(env_id: str) -> str | None:
    from palaestra.registry import installed_environments

    ep = installed_environments().get(env_id)
    dist = getattr(ep, "dist", None) if ep is not None else None
    return f"{dist.name} {dist.version}" if dist is not None else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
